"""A final job has its whole log and no live task (issue 22): over 50 jobs, one-worker ones and two-worker
MultiWorkerMirrored ones whose workers end 0.3 s apart (worker 0's exit decides the job), every task's log is read
the moment the job is seen final: every line each task printed, its last one included, is there, and no task of the
job is active."""

from __future__ import annotations

import pytest

from orchestrator.models import ACTIVE_TASK_STATES, Job, Task
from tests.orchestrator.test_jobs_e2e import FINAL, cluster_of, submit  # noqa: F401 - cluster_of is a fixture
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 50


def expected_lines(task: Task) -> list[str]:
    name = f"{task.type} {task.index}"
    return [*(f"line {i} of {name}" for i in range(20)), f"last words of {name}"]


@pytest.mark.timeout(900)
def test_every_line_is_in_and_no_task_is_active_the_moment_a_job_is_final(api, cluster_of):  # noqa: F811
    cluster_of(2, first_port=27400)
    short = []
    for n in range(JOBS):
        shape = {"strategy": "mirrored", "workers": 1} if n % 2 else {"strategy": "multi_worker_mirrored", "workers": 2}
        job_id = submit(api, "last_words.py", devices_per_worker=1, **shape)
        # Polled often: the first read that sees the job final is the moment it is.
        state = wait_until(
            lambda job_id=job_id: (
                (s := Job.objects.filter(pk=job_id).values_list("state", flat=True)[0]) in FINAL and s
            ),
            timeout=120,
            interval=0.01,
            what=f"job {job_id} final",
        )
        tasks = list(Task.objects.filter(job_id=job_id))
        logs = {t.pk: list(t.log_lines.order_by("seq").values_list("text", flat=True)) for t in tasks}
        assert state == "succeeded", Job.objects.get(pk=job_id).reason
        assert [t.state for t in tasks if t.state in ACTIVE_TASK_STATES] == []
        assert len(tasks) == shape["workers"]
        for task in tasks:
            if sorted(logs[task.pk]) != sorted(expected_lines(task)):
                short.append((job_id, task.label, len(logs[task.pk])))
    assert short == []  # (job, task, lines stored) of every final job whose log was short
