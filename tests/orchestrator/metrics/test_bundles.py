"""A host's bundle of reports (contracts/bundles.py): verified once, each report checked against its task, stored in
order; a bundle sealed by another host, or carrying another host's task, stores nothing of that."""

from __future__ import annotations

import time

import pytest

from contracts.bundles import HOST_REPORTS
from contracts.protocol import HOST_SAMPLES, TASK_ARTIFACT, TASK_LOGS, TASK_METRICS
from orchestrator.identity import auth
from orchestrator.metrics import ingest
from orchestrator.models import HostSample, MetricPoint, Task, TaskLogLine
from orchestrator.plumbing import counters
from tests import factories
from tests.orchestrator.metrics.conftest import envelope

pytestmark = pytest.mark.django_db


def metrics(task, *steps):
    events = [{"kind": "metric", "ts": time.time(), "step": s, "phase": "train", "metrics": {"loss": 1.0 / s}}
              for s in steps]  # fmt: skip
    return [TASK_METRICS, {"task_id": task.pk, "attempt": 1, "events": events}]


def test_a_bundle_stores_every_report_it_carries(running):
    _owner, host, token, job, task = running
    sample = {"ts": time.time(), "cpu_percent": 5.0, "memory_used_mb": 1, "memory_total_mb": 2, "gpus": []}
    reports = [
        metrics(task, 1, 2),
        [TASK_LOGS, {"task_id": task.pk, "attempt": 1, "lines": [[0, "stdout", "hello"]]}],
        [HOST_SAMPLES, {"samples": [sample]}],
        metrics(task, 3),
    ]

    stored = ingest.store_reports([(HOST_REPORTS, envelope(host, token, {"reports": reports}, HOST_REPORTS))])

    assert stored.points == 3 and stored.lines == 1 and stored.samples == 1
    assert list(MetricPoint.objects.filter(job=job).values_list("step", flat=True)) == [1, 2, 3]
    assert TaskLogLine.objects.filter(task=task).count() == 1
    assert HostSample.objects.filter(host=host).count() == 1


def test_a_bundle_sealed_with_another_key_stores_nothing(running):
    _owner, host, _token, job, task = running
    refused = counters.get(auth.REFUSED)

    stored = ingest.store_reports(
        [(HOST_REPORTS, envelope(host, "tfa_wrong", {"reports": [metrics(task, 1)]}, HOST_REPORTS))]
    )

    assert stored.points == 0 and stored.dropped == 1
    assert not MetricPoint.objects.filter(job=job).exists()
    assert counters.get(auth.REFUSED) - refused == 1


def test_a_bundled_report_about_another_hosts_task_is_dropped_the_rest_stored(running):
    _owner, host, token, job, task = running
    other, _other_token = factories.host("node-9", port_min=25000)
    theirs = Task.objects.create(job=job, attempt=1, type="worker", index=1, host=other, state="running")
    artifact = {"task_id": task.pk, "attempt": 1, "name": "m", "sha256": "0" * 64, "content_b64": ""}
    reports = [metrics(theirs, 1), metrics(task, 2), [TASK_ARTIFACT, artifact], ["nonsense"]]

    stored = ingest.store_reports([(HOST_REPORTS, envelope(host, token, {"reports": reports}, HOST_REPORTS))])

    assert list(MetricPoint.objects.filter(job=job).values_list("task_id", "step")) == [(task.pk, 2)]
    assert stored.dropped == 1  # the foreign one; the artifact and the nonsense are not reports a bundle carries
    assert not stored.failed
