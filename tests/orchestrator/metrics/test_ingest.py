"""Metric batches from agents: stored once, forged ones dropped, served by the API."""

from __future__ import annotations

import time

import pytest
from rest_framework.test import APIClient

from contracts.protocol import TASK_METRICS
from orchestrator.api import job_views
from orchestrator.metrics import ingest
from orchestrator.models import Job, MetricPoint, Task
from orchestrator.plumbing import counters
from tests.orchestrator.metrics.conftest import envelope
from tests.support.streaming import streamed
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db


def metric(step, **values):
    return {
        "kind": "metric",
        "ts": time.time(),
        "mono": 1.0,
        "step": step,
        "epoch": 0,
        "phase": "train",
        "metrics": values,
    }


def test_a_redelivered_batch_is_stored_once(running):
    _owner, host, token, job, task = running
    batch = {"task_id": task.pk, "attempt": 1, "events": [metric(10, loss=0.5, accuracy=0.8), metric(20, loss=0.4)]}

    ingest.handle_task_metrics(envelope(host, token, batch))
    ingest.handle_task_metrics(envelope(host, token, batch))

    assert MetricPoint.objects.filter(job=job).count() == 3


def test_facts_from_worker_0_become_the_jobs_facts(running):
    _owner, host, token, job, task = running
    facts = {"kind": "facts", "ts": time.time(), "facts": {"global_batch": 64, "effective_learning_rate": 0.002}}

    ingest.handle_task_metrics(envelope(host, token, {"task_id": task.pk, "attempt": 1, "events": [facts]}))

    assert Job.objects.get(pk=job.pk).facts == {"global_batch": 64, "effective_learning_rate": 0.002}


def test_a_replayed_older_facts_report_leaves_the_newer_facts(running):
    _owner, host, token, job, task = running
    now = time.time()

    def facts_report(at: float, **facts: object) -> dict:
        body = {"task_id": task.pk, "attempt": 1, "events": [{"kind": "facts", "ts": at, "facts": facts}]}
        return sealed(host.name, token, TASK_METRICS, body, now=at)

    older, newer = facts_report(now - 60, resumed_from_epoch=0), facts_report(now - 30, resumed_from_epoch=4)
    outdated = counters.get(ingest.FACTS_OUTDATED)

    ingest.store_reports([(TASK_METRICS, older)])
    ingest.store_reports([(TASK_METRICS, newer)])
    ingest.store_reports([(TASK_METRICS, older)])  # the stream entry again, replayed
    ingest.store_reports([(TASK_METRICS, newer), (TASK_METRICS, older)])  # and both in one read, the older last

    assert Task.objects.get(pk=task.pk).facts == {"resumed_from_epoch": 4}
    assert Job.objects.get(pk=job.pk).facts == {"resumed_from_epoch": 4}
    assert counters.get(ingest.FACTS_OUTDATED) - outdated == 1


@pytest.mark.parametrize(
    "forge",
    [
        lambda host, token, task: envelope(
            host, "tfa_wrong", {"task_id": task.pk, "attempt": 1, "events": [metric(1, loss=1)]}
        ),
        lambda host, token, task: envelope(
            host, token, {"task_id": task.pk, "attempt": 2, "events": [metric(1, loss=1)]}
        ),
        lambda host, token, task: envelope(
            host, token, {"task_id": task.pk + 999, "attempt": 1, "events": [metric(1, loss=1)]}
        ),
        lambda host, token, task: envelope(host, token, {"nonsense": True}),
    ],
    ids=["bad token", "stale attempt", "unknown task", "malformed"],
)
def test_a_forged_or_stale_batch_is_dropped(running, forge):
    _owner, host, token, _job, task = running

    assert ingest.handle_task_metrics(forge(host, token, task)) == 0
    assert not MetricPoint.objects.exists()


def test_non_numbers_and_non_finite_values_are_skipped(running):
    _owner, host, token, _job, task = running
    events = [metric(1, loss=float("nan"), note="text", ok=True, accuracy=0.5), {"kind": "metric"}, "junk"]

    ingest.handle_task_metrics(envelope(host, token, {"task_id": task.pk, "attempt": 1, "events": events}))

    assert list(MetricPoint.objects.values_list("name", "value")) == [("accuracy", 0.5)]


def test_the_metrics_api_pages_with_a_cursor(running):
    owner, host, token, job, task = running
    events = [metric(step, loss=1.0 / step) for step in range(1, 6)]
    ingest.handle_task_metrics(envelope(host, token, {"task_id": task.pk, "attempt": 1, "events": events}))
    client = APIClient()
    client.force_authenticate(owner)

    first = client.get(f"/api/jobs/{job.pk}/metrics/?name=loss").json()
    ingest.handle_task_metrics(
        envelope(host, token, {"task_id": task.pk, "attempt": 1, "events": [metric(6, loss=0.1)]})
    )
    later = client.get(f"/api/jobs/{job.pk}/metrics/?since={first['next']}").json()

    assert [p[4] for p in first["points"]] == [1, 2, 3, 4, 5]
    assert [(p[3], p[4], p[6]) for p in later["points"]] == [("loss", 6, 0.1)]


def test_the_csv_export_has_every_point(running, monkeypatch):
    owner, host, token, job, task = running
    monkeypatch.setattr(job_views, "CSV_PAGE", 2)  # streamed a page at a time: two pages here
    events = [metric(step, loss=1.0 / step) for step in range(1, 4)]
    ingest.handle_task_metrics(envelope(host, token, {"task_id": task.pk, "attempt": 1, "events": events}))
    client = APIClient()
    client.force_authenticate(owner)

    response = client.get(f"/api/jobs/{job.pk}/metrics-csv/")

    lines = streamed(response).decode().splitlines()
    assert lines[0] == "id,task_type,task_index,attempt,phase,name,step,epoch,value,ts"
    assert [line.split(",")[5:7] for line in lines[1:]] == [["loss", "1"], ["loss", "2"], ["loss", "3"]]
    assert "attachment" in response["Content-Disposition"]


def test_a_task_unknown_when_first_named_gets_its_points_once_it_exists(running):
    _owner, host, token, job, task = running
    future_id = task.pk + 1000
    report = {"task_id": future_id, "attempt": 1, "events": [metric(1, loss=1.0)]}

    assert ingest.handle_task_metrics(envelope(host, token, report)) == 0  # no such task yet: dropped, not remembered
    Task.objects.create(pk=future_id, job=job, attempt=1, type="worker", index=1, host=host, state="running")

    assert ingest.handle_task_metrics(envelope(host, token, report)) == 1
    assert list(MetricPoint.objects.filter(task_id=future_id).values_list("step", "value")) == [(1, 1.0)]
