"""The input-bound judgement: TF's profiler's thresholds over a worker's recent windows, the fix that fits what its
host showed, and the same on a stored job: in the API's job detail (`insights.input`, not computed for the list)
and on the job page, to its owner only. The windows' shares are those bench/input_bound.py measured for the three
scripts of tests/programs/input_bound/ (0.52, 0.08, 0.01)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from orchestrator.insights import input_bound
from orchestrator.insights.input_bound import FIX_CPU, FIX_PARALLEL, judge_worker, level
from orchestrator.models import HostSample, Job, MetricPoint, Task
from tests import factories

pytestmark = pytest.mark.django_db


def test_the_thresholds_are_the_tf_profilers() -> None:
    assert [level(s) for s in (0.0, 0.049, 0.05, 0.199, 0.2, 1.0)] == [
        "not", "not", "moderately", "moderately", "highly", "highly"
    ]  # fmt: skip


def test_the_mean_of_the_recent_windows_is_judged_as_the_profiler_takes_the_whole_trace() -> None:
    steady = [0.01] * 9 + [0.3]  # one window holding an epoch's first fetch
    assert judge_worker(steady).level == "not" and judge_worker(steady).fix == ""
    every_other_step = [0.0, 0.9] * 5  # steps of 0.5 s or more: a window is a step
    assert judge_worker(every_other_step).level == "highly"
    assert judge_worker([0.9] * 20 + [0.01] * 10).level == "not"  # only the last 10 windows count
    early = judge_worker([0.5, 0.5])
    assert (early.level, early.windows) == ("too_early", 2)


def test_the_fix_is_more_cpus_or_cache_when_the_host_is_saturated_else_prefetch_and_parallel_calls() -> None:
    assert judge_worker([0.52] * 10, host_cpu_percent=40.0).fix == FIX_PARALLEL
    assert judge_worker([0.08] * 10).fix == FIX_PARALLEL
    saturated = judge_worker([0.52] * 10, host_cpu_percent=97.0)
    assert saturated.level == "highly" and saturated.fix == FIX_CPU
    assert "cache" in FIX_CPU and "prefetch" in FIX_PARALLEL and "num_parallel_calls" in FIX_PARALLEL


def store(job: Job, task: Task, share: float, count: int = 10, t0: float = 1000.0) -> None:
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, task=task, phase="train", name=name, step=5 * (n + 1), value=value, ts=t0 + 0.5 * n)
        for n in range(count)
        for name, value in (("input_wait_fraction", share), ("step_time_s", 0.1))
    )


def running_gang(owner) -> tuple[Job, list[Task]]:  # type: ignore[no-untyped-def]
    tasks = factories.gang(owner, 2)
    job = tasks[0].job
    Job.objects.filter(pk=job.pk).update(started_at=job.created_at, state="running", attempt=1)
    job.refresh_from_db()
    return job, tasks


def test_a_stored_job_is_judged_per_worker_with_its_hosts_cpu(alice) -> None:  # type: ignore[no-untyped-def]
    job, tasks = running_gang(alice)
    assert input_bound.judge(job)["state"] == "not_measured"
    store(job, tasks[0], 0.52)
    store(job, tasks[1], 0.01)
    for n in range(10):
        HostSample.objects.create(host=tasks[0].host, ts=1000.0 + 0.5 * n, cpu_percent=98.0)

    found = input_bound.judge(job)

    assert found["state"] == "measured"
    first, second = found["workers"]
    assert (first["task_id"], first["level"], first["windows"]) == (tasks[0].pk, "highly", 10)
    assert first["host_cpu_percent"] == 98.0 and first["fix"] == FIX_CPU
    assert first["message"] == (
        f"{tasks[0].label} is highly input-bound: waits 52% of each step for its input (52 ms of a 100 ms step); "
        "its host's CPU 98% busy."
    )
    assert (second["level"], second["fix"]) == ("not", "")
    assert found["message"] == first["message"]  # only the input-bound worker is named


def test_the_api_detail_and_the_page_show_it_to_the_owner_only(alice, bob, client) -> None:  # type: ignore[no-untyped-def]
    job, tasks = running_gang(alice)
    store(job, tasks[1], 0.08)
    owner = APIClient()
    owner.force_authenticate(alice)

    detail = owner.get(f"/api/jobs/{job.pk}/").json()["insights"]["input"]
    assert detail["state"] == "measured" and detail["thresholds"] == {"highly": 0.2, "moderately": 0.05}
    [worker] = detail["workers"]
    assert (worker["task"], worker["level"], worker["fix"]) == (tasks[1].label, "moderately", FIX_PARALLEL)
    [listed] = [j for j in owner.get("/api/jobs/").json()["results"] if j["id"] == job.pk]
    assert "input" not in listed["insights"]  # the list is read from the row: no insight computed per job
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="input-bound" data-state="measured"' in page
    assert f'data-task-id="{tasks[1].pk}" data-level="moderately"' in page and "moderately input-bound" in page
    other = APIClient()
    other.force_authenticate(bob)
    assert other.get(f"/api/jobs/{job.pk}/").status_code == 404
    client.force_login(bob)
    assert client.get(f"/jobs/{job.pk}/").status_code == 404


def test_a_job_that_measured_nothing_says_what_is_measured(alice, client) -> None:  # type: ignore[no-untyped-def]
    job, _tasks = running_gang(alice)  # e.g. a custom training loop: no input_wait_fraction
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="input-bound" data-state="not_measured"' in page
    assert "not for ParameterServer, steps_per_execution &gt; 1, run_eagerly or custom training loops" in page
    Job.objects.filter(pk=job.pk).update(started_at=None)
    assert 'id="input-bound"' not in client.get(f"/jobs/{job.pk}/").content.decode()  # not before it starts
