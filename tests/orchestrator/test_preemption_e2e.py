"""A shared fleet with real agents and TensorFlow processes on two local hosts: a high-priority job preempts a low
MultiWorkerMirrored (or ParameterServer) one, which goes back to the queue and resumes from its own checkpoint when
the devices are free again, its page telling the story; a run past its time limit is stopped (SIGTERM, the grace,
SIGKILL) and ends timed out with its checkpoint kept."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from orchestrator.models import Host, Job, JobEvent, PriorityClass, Task
from orchestrator.scheduler import queueing
from tests.orchestrator.test_faults_e2e import epochs_done
from tests.orchestrator.test_jobs_e2e import log_text, wait_for_job
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two_hosts(cluster_sharing_a_folder):  # type: ignore[no-untyped-def]
    cluster = cluster_sharing_a_folder(2, "pre", 28800)
    Host.objects.filter(cluster=cluster).update(cpu_slots=1)  # a device each: two 2-worker jobs cannot run together
    # A victim trains on through the stop order's way and, where TensorFlow cannot save at the stop's step
    # (ParameterServer), through the grace, and a run that completes then is done, not resumed
    # (task_events._completed_while_stopped). A short grace and a long run keep the preemption ahead of the low
    # job's end on a loaded machine. (A MultiWorkerMirrored victim saves at its next step and exits 42 well within
    # it: test_step_preemption_e2e.py.)
    cluster.stop_grace_s = 1
    cluster.save(update_fields=["stop_grace_s"])
    return cluster


def submit(api: APIClient, name: str, priority: str, config: dict, **more: object) -> int:
    shape = {"strategy": "multi_worker_mirrored", "workers": 2, "devices_per_worker": 1, **more}
    response = api.post(
        "/api/jobs/",
        {"name": name, "builtin": "digits_mlp", "builtin_config": config, "priority": priority, **shape},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    return response.json()["id"]


LOW_RUN = {"epochs": 10, "per_replica_batch": 32, "steps_per_epoch": 30}  # ~0.7 s an epoch on a quiet 2-core machine


def speaker(job_id: int, attempt: int) -> Task:
    """The task whose epochs count (the chief of a ParameterServer job, worker 0 otherwise)."""
    tasks = Task.objects.filter(job_id=job_id, attempt=attempt)
    return tasks.filter(type="chief").first() or tasks.get(type="worker", index=0)


@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_a_high_job_preempts_a_low_one_which_resumes_from_its_checkpoint(api, two_hosts, client, alice, strategy):
    shape = {"strategy": strategy, "ps": 1} if strategy == "parameter_server" else {}
    queueing.standard_classes_if_none()  # a flushed database has none until a job names one
    PriorityClass.objects.get(name="high").users.add(alice)  # high is a right staff grant (issue 42)
    PriorityClass.objects.filter(name="low").update(min_run_s=0)  # no minimum run: preempted as soon as checkpointed
    low_id = submit(api, "low, long", "low", LOW_RUN, **shape)
    wait_for_job(low_id, ("running",), timeout=90)
    first = speaker(low_id, 1)
    wait_until(lambda: len(epochs_done(first)) >= 2, timeout=150, what="2 epochs done (checkpointed)")

    high_id = submit(api, "high, urgent", "high", {"epochs": 1, "per_replica_batch": 32, "steps_per_epoch": 5})

    high = wait_for_job(high_id, timeout=180)
    low = wait_for_job(low_id, timeout=300)
    assert high.state == "succeeded", high.reason
    second = speaker(low_id, 2)
    assert low.state == "succeeded", (low.reason, log_text(second)[-2000:])
    assert (low.preemptions, low.restarts, low.attempt) == (1, 0, 2)  # no restart used
    preempted = JobEvent.objects.get(job=low, kind="preempted").text
    resumed = JobEvent.objects.get(job=low, kind="resumed").text
    assert preempted.startswith(f"preempted by #{high_id} (a lower priority class) in epoch ")
    stopped_in = int(preempted.split("in epoch ")[1].split()[0])
    # "resumed at epoch 4 on ..." from an epoch-end backup; "resumed at epoch 4, step 17 on ..." from one saved at
    # the stop's step (MultiWorkerMirrored: worker_agent/runtime/preemption.py).
    at = re.fullmatch(r"resumed at epoch (\d+)(?:, step (\d+))? on pre-.*", resumed)
    assert at is not None, resumed
    resumed_at = int(at.group(1))
    assert stopped_in >= 3  # 2 epochs were done when the high job came
    # Nothing done before the preemption is lost. Until the stop takes effect a short epoch or two may still end (and
    # be checkpointed): then it goes on from the one after.
    assert resumed_at >= stopped_in
    assert set(range(1, stopped_in)) <= set(epochs_done(first))
    assert second.facts["resumed_from_epoch"] == resumed_at - 1  # from its own checkpoint, not from epoch 1
    assert epochs_done(second) == list(range(resumed_at, LOW_RUN["epochs"] + 1))
    # Its progress counts from where this run resumed (its ETA from the second attempt's own epochs only).
    progress = wait_until(
        lambda: (p := Job.objects.get(pk=low_id).progress).get("epoch") == LOW_RUN["epochs"] and p, 30, what="progress"
    )
    assert (progress["resumed_from_epoch"], progress["eta_s"]) == (resumed_at - 1, 0.0), progress
    client.force_login(alice)
    page = client.get(f"/jobs/{low_id}/").content.decode()
    assert preempted in page and resumed in page


def test_a_run_past_its_time_limit_is_stopped_and_ends_timed_out_keeping_its_checkpoint(api, two_hosts):
    config = {"epochs": 200, "per_replica_batch": 32, "steps_per_epoch": 20}
    job_id = submit(api, "never ends in time", "normal", config, time_limit_s=600)
    wait_for_job(job_id, ("running",), timeout=90)
    task = speaker(job_id, 1)
    wait_until(lambda: len(epochs_done(task)) >= 1, timeout=120, what="an epoch done")
    Job.objects.filter(pk=job_id).update(time_limit_s=1)  # as if its limit had come (the minimum is a minute)

    job = wait_for_job(job_id, timeout=60)

    assert job.state == "timed_out" and job.reason.startswith("time limit of 1 s reached (after epoch ")
    wait_until(
        lambda: set(Task.objects.filter(job=job).values_list("state", flat=True)) == {"killed"},
        timeout=30,
        what="its processes stopped (SIGTERM, the grace, SIGKILL)",
    )
    assert JobEvent.objects.filter(job=job, kind="timed_out").exists()
    verdict = wait_until(lambda: Job.objects.get(pk=job_id).diagnosis, timeout=10, what="the verdict")
    assert (verdict["kind"], verdict["task"]) == ("time_limit", ""), verdict
    # Its tasks, stopped by the product for the limit, are listed (once they have ended) as stopped, never as a cause.
    assert all(peer["kind"] == "stopped" for peer in verdict["peers"]), verdict
    assert verdict["hint"].startswith("Raise the job's time limit")
    # Its last checkpoint is kept (only a run that completes empties it): "Run again" or a restart can resume.
    backups = Path(two_hosts.shared_dir) / "jobs" / str(job_id) / "checkpoints"
    assert any(path.is_file() for path in backups.rglob("*")), list(backups.rglob("*"))
