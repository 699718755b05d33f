"""The slow-worker rule on stored points (the windows are those measured by tests/orchestrator/test_slow_worker_e2e.py,
worker 0's and worker 1's steps/s): a ParameterServer worker beside a pinned CPU hog is named with its host and what
its host's samples show; an even run, a short one and one that measured nothing name no one; under
MultiWorkerMirrored the worker that waits longest for its input is named when the difference is material. Shown on
the job's page and in its API detail (not computed for the list), to its owner only."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from orchestrator.insights import slow_worker
from orchestrator.insights.slow_worker import lagging_multi_worker, lagging_parameter_server
from orchestrator.models import Host, HostSample, Job, MetricPoint, Task
from tests import factories

pytestmark = pytest.mark.django_db

# Measured (steps/s of worker 0, worker 1 per 2 s window), one job: both free, then worker 1 pinned beside stress-ng.
EVEN = [(8.0, 23.0), (12.4, 18.4), (18.5, 15.5), (26.5, 26.5), (18.4, 17.9), (15.5, 16.0), (20.5, 20.5), (18.5, 21.0),
        (17.0, 20.5), (15.9, 20.9), (13.5, 18.5)]  # fmt: skip
LOADED = [(38.5, 7.0), (32.0, 4.5), (23.5, 15.0), (29.0, 10.5), (36.3, 9.0), (25.5, 8.5), (26.5, 7.5), (23.9, 7.0),
          (22.8, 7.9)]  # fmt: skip


def windows(pairs: list[tuple[float, float]]) -> list[dict[int, float]]:
    return [{0: a, 1: b} for a, b in pairs]


def test_it_names_the_worker_beside_the_hog_and_no_one_in_the_even_run() -> None:
    [lag] = lagging_parameter_server(windows(EVEN[-1:] + LOADED))
    assert (lag.index, lag.windows, lag.considered) == (1, 8, 10)  # not behind: the even window and 15/23.5 = 0.64
    assert 0.25 < lag.share < 0.35
    assert lagging_parameter_server(windows(EVEN)) == []
    assert lagging_parameter_server(windows(EVEN[:2])) == []  # its two start-up windows alone


def test_three_workers_are_judged_against_the_median_of_the_others() -> None:
    runs = [{0: 20.0, 1: 21.0, 2: 9.0}] * 8 + [{0: 20.0, 1: 21.0, 2: 19.0}] * 2
    assert [lag.index for lag in lagging_parameter_server(runs)] == [2]
    stalled = [{0: 20.0, 1: 0.0, 2: 19.0}] * 7  # a worker that completed nothing shows as 0, and is named
    assert [lag.index for lag in lagging_parameter_server(stalled)] == [1]


def test_under_multi_worker_mirrored_the_worker_that_waits_for_its_input_is_named() -> None:
    step = 0.2
    series = {0: [(0.02, step)] * 10, 1: [(0.35, step)] * 10, 2: [(0.03, step)] * 10}
    [lag] = lagging_multi_worker(series)
    assert lag.index == 1 and lag.share == pytest.approx((0.07 - 0.005) / step)  # its wait, the others' median
    close = {0: [(0.02, step)] * 10, 1: [(0.10, step)] * 10}  # 8 % of the step more: not material
    assert lagging_multi_worker(close) == []
    assert lagging_multi_worker({0: [(0.0, step)] * 10, 1: [(0.5, step)] * 3}) == []  # too few windows of worker 1


# --- the same on a job's stored rows ------------------------------------------------------------------------------
def ps_job(owner) -> tuple[Job, dict[str, Task]]:  # type: ignore[no-untyped-def]
    cluster = factories.cluster()
    hosts = []
    for name in ("pace-0", "pace-1"):
        host, _token = factories.host(name)
        host.save()
        hosts.append(host)
    job = Job.objects.create(owner=owner, cluster=cluster, name="ps", strategy="parameter_server",
                             program_kind="builtin", builtin="digits_mlp", workers=2, ps=1)  # fmt: skip
    Job.objects.filter(pk=job.pk).update(started_at=job.created_at, state="running", attempt=1)
    job.refresh_from_db()
    tasks = {
        "chief": Task.objects.create(job=job, type="chief", index=0, host=hosts[0], pid=101),
        "worker0": Task.objects.create(job=job, type="worker", index=0, host=hosts[0], pid=102),
        "worker1": Task.objects.create(job=job, type="worker", index=1, host=hosts[1], pid=103),
        "ps": Task.objects.create(job=job, type="ps", index=0, host=hosts[1], pid=104),
    }
    return job, tasks


def store_pace(job: Job, chief: Task, pairs: list[tuple[float, float]], t0: float = 1000.0) -> None:
    points = []
    for n, (a, b) in enumerate(pairs):
        for index, value in ((0, a), (1, b)):
            points.append(MetricPoint(job=job, task=chief, phase="train", name=f"worker_steps_per_s/{index}",
                                      step=70 * (n + 1), value=value, ts=t0 + 2 * n))  # fmt: skip
    MetricPoint.objects.bulk_create(points)


def store_cpu(job: Job, task: Task, percent: float, count: int, t0: float = 1000.0) -> None:
    MetricPoint.objects.bulk_create(
        MetricPoint(
            job=job, task=task, phase="train", name="process_cpu_percent", step=n + 1, value=percent, ts=t0 + 2 * n
        )
        for n in range(count)
    )


def sample(host: Host, ts: float, cpu: float, gpus: list | None = None) -> None:  # type: ignore[type-arg]
    HostSample.objects.create(host=host, ts=ts, cpu_percent=cpu, gpus=gpus or [])


def test_a_stored_ps_job_names_the_slow_worker_its_host_and_its_busy_cpu(alice) -> None:  # type: ignore[no-untyped-def]
    job, tasks = ps_job(alice)
    pairs = EVEN[-1:] + LOADED
    store_pace(job, tasks["chief"], pairs)
    slow_host = tasks["worker1"].host
    for n in range(len(pairs)):
        sample(slow_host, 1000.0 + 2 * n, 96.0)
    store_cpu(job, tasks["worker1"], 12.0, len(pairs))
    store_cpu(job, tasks["ps"], 8.0, len(pairs))

    found = slow_worker.judge(job)

    assert found is not None and found["state"] == "slow" and found["windows"] == 10
    [named] = found["workers"]
    assert (named["task_id"], named["index"], named["host"]) == (tasks["worker1"].pk, 1, "pace-1")
    assert named["message"].startswith("worker 1 on pace-1 completes ")
    assert "below 50% in 8 of the last 10 windows" in named["detail"]
    assert named["host_notes"] == [
        "CPU busy with other processes (96% of the host busy, this job's tasks there 20%, worker 1 itself 12%)"
    ]


def test_a_host_busy_with_this_jobs_own_tasks_or_a_shared_gpu_says_so(alice) -> None:  # type: ignore[no-untyped-def]
    job, tasks = ps_job(alice)
    store_pace(job, tasks["chief"], LOADED + LOADED[:1])
    slow_host = tasks["worker1"].host
    gpu = {"index": 0, "utilization_percent": 97.0, "processes": [{"pid": 103}, {"pid": 999}]}
    for n in range(10):
        sample(slow_host, 1000.0 + 2 * n, 90.0, [gpu])
    store_cpu(job, tasks["worker1"], 50.0, 10)
    store_cpu(job, tasks["ps"], 30.0, 10)

    [named] = slow_worker.judge(job)["workers"]  # type: ignore[index]

    # 90 % busy, 80 of it this job's own: no "other processes"; the GPU lists a process that is none of the job's.
    assert named["host_notes"] == ["GPU shared (GPU 0 also runs 1 other process, 97% utilized)"]


def test_an_even_a_short_and_an_unmeasured_run_name_no_one(alice) -> None:  # type: ignore[no-untyped-def]
    job, tasks = ps_job(alice)
    assert slow_worker.judge(job)["state"] == "not_measured"  # type: ignore[index]
    store_pace(job, tasks["chief"], EVEN[:3])
    assert slow_worker.judge(job)["state"] == "too_early"  # type: ignore[index]
    MetricPoint.objects.all().delete()
    store_pace(job, tasks["chief"], EVEN)
    found = slow_worker.judge(job)
    assert found["state"] == "even" and found["workers"] == []  # type: ignore[index]
    assert found["message"] == "No slow worker: none fell behind in the last 10 windows."  # type: ignore[index]
    job.workers = 1
    assert slow_worker.judge(job) is None  # no others to compare with
    job.strategy, job.workers = "mirrored", 2
    assert slow_worker.judge(job) is None


def test_a_stored_multi_worker_job_names_the_worker_waiting_for_its_input(alice) -> None:  # type: ignore[no-untyped-def]
    tasks = factories.gang(alice, 2)
    job = tasks[0].job
    Job.objects.filter(pk=job.pk).update(started_at=job.created_at, state="running", attempt=1)
    job.refresh_from_db()
    for task, fraction in zip(tasks, (0.02, 0.4), strict=True):
        MetricPoint.objects.bulk_create(
            MetricPoint(job=job, task=task, phase="train", name=name, step=10 * (n + 1), value=value, ts=1000.0 + n)
            for n in range(10)
            for name, value in (("input_wait_fraction", fraction), ("step_time_s", 0.25))
        )
        # Windows in which the runtime sampled no input wait carry a step time alone: they are passed over.
        MetricPoint.objects.bulk_create(
            MetricPoint(job=job, task=task, phase="train", name="step_time_s", step=10 * n + 5, value=0.25, ts=1000.0)
            for n in range(1, 30)
        )
    found = slow_worker.judge(job)
    assert found is not None and found["state"] == "slow"
    [named] = found["workers"]
    assert named["task_id"] == tasks[1].pk
    assert named["detail"].startswith("waits 100 ms per step for its input against the others' 5 ms")


def test_the_api_detail_and_the_page_show_it_to_the_owner_only(alice, bob, client) -> None:  # type: ignore[no-untyped-def]
    job, tasks = ps_job(alice)
    store_pace(job, tasks["chief"], EVEN[-1:] + LOADED)
    owner = APIClient()
    owner.force_authenticate(alice)

    detail = owner.get(f"/api/jobs/{job.pk}/").json()["insights"]["slow_worker"]
    assert detail["state"] == "slow" and detail["workers"][0]["task"] == "worker 1 on pace-1"
    [listed] = [j for j in owner.get("/api/jobs/").json()["results"] if j["id"] == job.pk]
    assert "slow_worker" not in listed["insights"]  # the list is read from the row: no insight computed per job
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="slow-worker" data-state="slow"' in page and "<strong>worker 1 on pace-1</strong> completes" in page
    other = APIClient()
    other.force_authenticate(bob)
    assert other.get(f"/api/jobs/{job.pk}/").status_code == 404
    client.force_login(bob)
    assert client.get(f"/jobs/{job.pk}/").status_code == 404
