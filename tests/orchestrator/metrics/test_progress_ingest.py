"""Job.progress kept at ingest (orchestrator/metrics/progress.py): from the speaking task's facts, train windows and
epoch_end points, in one UPDATE for every job of a batch; another task's points, and an earlier attempt's, leave it
alone; a resumed attempt counts from where it resumed; train windows alone write it at most every MIN_INTERVAL_S."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from contracts.protocol import TASK_METRICS
from orchestrator.metrics import ingest
from orchestrator.metrics import progress as job_progress
from orchestrator.models import Job, Task
from tests.orchestrator.metrics.conftest import envelope

pytestmark = pytest.mark.django_db

SPE = 10
FACTS = {"epochs": 5, "steps_per_epoch": SPE, "global_batch": 64, "examples_per_step_this_task": 32}


@pytest.fixture(autouse=True)
def every_window_written(monkeypatch):
    """Each batch writes the progress (the throttle has a test of its own); none remembered from another test."""
    monkeypatch.setattr(job_progress, "MIN_INTERVAL_S", 0.0)
    monkeypatch.setattr(job_progress, "_written", {})


def facts(**extra: object) -> dict:
    return {"kind": "facts", "ts": time.time(), "facts": {**FACTS, "resumed_from_epoch": 0, **extra}}


def window(epoch: int, batch: int, ts: float, steps_per_s: float = 4.0) -> dict:
    """A train window of epoch `epoch` (from 1) ending at its step `batch`."""
    step = (epoch - 1) * SPE + batch
    values = {"loss": 0.5, "steps_per_s": steps_per_s, "examples_per_s": steps_per_s * 32}
    return {"kind": "metric", "ts": ts, "step": step, "epoch": epoch, "phase": "train", "metrics": values}


def epoch_end(epoch: int, seconds: float, ts: float) -> dict:
    values = {"loss": 0.4, "epoch_time_s": seconds}
    return {"kind": "metric", "ts": ts, "step": epoch * SPE, "epoch": epoch, "phase": "epoch_end", "metrics": values}


def send(host, token, task, *events, attempt: int = 1) -> None:  # type: ignore[no-untyped-def]
    ingest.handle_task_metrics(envelope(host, token, {"task_id": task.pk, "attempt": attempt, "events": list(events)}))


def progress(job: Job) -> dict:
    return Job.objects.get(pk=job.pk).progress


def test_epoch_end_points_of_the_speaking_task_make_the_jobs_progress(running):
    _owner, host, token, job, task = running
    t0 = time.time() - 100
    send(host, token, task, facts())
    assert progress(job) == {}  # nothing measured yet: a fresh run

    send(host, token, task, window(1, 5, t0 + 2))
    assert progress(job)["epoch"] == 1 and progress(job)["eta_s"] == pytest.approx(11.2)  # 45 steps left at 4/s

    send(host, token, task, epoch_end(1, 20.0, t0 + 20), window(2, 5, t0 + 25), epoch_end(2, 10.0, t0 + 30))
    send(host, token, task, epoch_end(3, 12.0, t0 + 42), window(4, 5, t0 + 47, steps_per_s=2.0))
    got = progress(job)
    assert got == {
        "epoch": 4, "epochs": 5, "step": 35, "steps": 50, "examples_per_s": 128.0,  # 2 steps/s x the global batch 64
        "eta_s": 16.5,  # median(10, 12) = 11 s (the first epoch, tracing, left out) x 2 epochs left, less half of 4
        "resumed_from_epoch": 0, "at": pytest.approx(t0 + 47),
    }  # fmt: skip

    send(host, token, task, epoch_end(4, 12.0, t0 + 54), epoch_end(5, 12.0, t0 + 66))
    assert (progress(job)["epoch"], progress(job)["epochs"], progress(job)["eta_s"]) == (5, 5, 0.0)


def test_another_workers_points_leave_the_progress_alone(running):
    _owner, host, token, job, task = running
    other = Task.objects.create(job=job, attempt=1, type="worker", index=1, host=host, state="running")
    send(host, token, task, facts(), epoch_end(1, 10.0, time.time()))
    before = progress(job)
    send(host, token, other, facts(), epoch_end(1, 99.0, time.time()), epoch_end(2, 99.0, time.time()))
    assert progress(job) == before and before["epoch"] == 1


def test_a_resumed_attempt_counts_from_where_it_resumed_and_the_earlier_attempt_is_ignored(running):
    _owner, host, token, job, task = running
    t0 = time.time() - 1000
    send(host, token, task, facts(), epoch_end(1, 1.0, t0 + 1), epoch_end(2, 1.0, t0 + 2))
    # Preempted and placed again: attempt 2's worker 0 resumed from epoch 2's checkpoint.
    Job.objects.filter(pk=job.pk).update(attempt=2)
    again = Task.objects.create(job=job, attempt=2, type="worker", index=0, host=host, state="running")
    send(host, token, again, facts(resumed_from_epoch=2), attempt=2)
    assert (progress(job)["epoch"], progress(job)["resumed_from_epoch"], progress(job)["eta_s"]) == (2, 2, None)

    send(host, token, again, epoch_end(3, 30.0, t0 + 500), attempt=2)
    assert progress(job)["eta_s"] == 60.0  # 2 epochs left at this run's 30 s, not the earlier attempt's 1 s
    # A late report of the earlier attempt's task is stored but is not this job's progress any more.
    send(host, token, task, epoch_end(3, 1.0, t0 + 3))
    assert progress(job)["eta_s"] == 60.0


def test_one_update_for_every_job_of_a_batch(running, django_user_model):
    _owner, host, token, job, task = running
    second = Job.objects.create(
        owner=job.owner, cluster=job.cluster, name="k", strategy="mirrored", program_kind="script", attempt=1
    )
    worker = Task.objects.create(job=second, attempt=1, type="worker", index=0, host=host, state="running")
    now = time.time()
    reports = [
        envelope(host, token, {"task_id": t.pk, "attempt": 1, "events": [facts(), epoch_end(1, 5.0, now)]})
        for t in (task, worker)
    ]
    with CaptureQueriesContext(connection) as queries:
        ingest.store_reports([(TASK_METRICS, report) for report in reports])
    updates = [
        q["sql"] for q in queries.captured_queries if q["sql"].strip().startswith("UPDATE") and "progress" in q["sql"]
    ]
    assert len(updates) == 1
    assert progress(job)["eta_s"] == progress(second)["eta_s"] == 20.0


def test_train_windows_alone_write_the_progress_at_most_every_interval(running, monkeypatch):
    _owner, host, token, job, task = running
    monkeypatch.setattr(job_progress, "MIN_INTERVAL_S", 3600.0)
    t0 = time.time() - 100
    send(host, token, task, facts(), window(1, 2, t0 + 1))  # facts: written at once
    assert progress(job)["step"] == 2
    send(host, token, task, window(1, 6, t0 + 2))  # a window alone, just after: left for a later batch
    assert progress(job)["step"] == 2
    send(host, token, task, window(1, 9, t0 + 3), epoch_end(1, 5.0, t0 + 5))  # an epoch's end: at once
    assert (progress(job)["step"], progress(job)["eta_s"]) == (10, 20.0)
    monkeypatch.setattr(job_progress, "MIN_INTERVAL_S", 0.0)
    send(host, token, task, window(2, 4, t0 + 7))  # the interval passed
    assert progress(job)["step"] == 14
