"""Backpressure that shows: while a host's metrics stream holds SHED_BACKLOG unstored entries, its agent (signed in as
the host's own broker user, which may read its own stream's length) sends only every SHED_STRIDE-th step of the
step-level points, never drops an epoch end or facts, and the count it left out reaches the job page, once however
often it is delivered."""

from __future__ import annotations

import time

import pytest
from celery import Celery

from contracts import broker
from contracts.metric_messages import SHED_STRIDE
from contracts.protocol import TASK_METRICS
from contracts.signing import agent_mac_key
from orchestrator.metrics import ingest
from orchestrator.models import MetricPoint, Task
from tests.orchestrator.metrics.conftest import consumer, envelope
from tests.support.wire import broker_user
from worker_agent import outbox as outbox_module
from worker_agent.outbox import Outbox

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 20  # SHED_BACKLOG for the test (2,000 entries in production)


def metric(step: int, phase: str = "train") -> dict:
    return {"kind": "metric", "ts": time.time(), "mono": 1.0, "step": step, "epoch": 1, "phase": phase,
            "metrics": {"loss": 1.0 / step}}  # fmt: skip


def report(out: Outbox, task: Task, events: list[dict]) -> None:
    """One report, in a round trip of its own (the outbox reads the stream's length in the same round trip)."""
    out.send(TASK_METRICS, {"task_id": task.pk, "attempt": 1, "events": events}, queue=broker.METRICS)
    assert out.flush(20)


def test_a_backed_up_stream_makes_the_agent_send_every_tenth_step_and_the_page_counts_the_rest(
    stream, running, redis_url, client, monkeypatch
):
    client_redis, name = stream
    owner, host, token, job, task = running
    monkeypatch.setattr(outbox_module, "SHED_BACKLOG", BACKLOG)
    app = Celery("backpressure-test", broker=broker_user(redis_url, host.name, token), set_as_current=False)
    out = Outbox(app, host.name, agent_mac_key(token, host.name))
    try:
        for step in range(1, BACKLOG + 1):  # the ingest reads nothing meanwhile: 20 entries wait
            report(out, task, [metric(step)])
        assert out.metrics_backlog == BACKLOG
        facts = {"kind": "facts", "facts": {"replicas": 2}}
        report(out, task, [metric(step) for step in range(21, 61)] + [metric(60, "epoch_end"), facts])
        ingest_reader = consumer(client_redis, name)
        while ingest_reader.drain_once():
            pass
        report(out, task, [metric(100)])  # its round trip finds the stream drained...
        report(out, task, [metric(step) for step in range(101, 106)])  # ...so this one goes whole
        while ingest_reader.drain_once():
            pass
    finally:
        out.stop()

    stored = list(MetricPoint.objects.filter(job=job).order_by("step", "phase").values_list("step", "phase"))
    left_out = [step for step in range(21, 61) if step % SHED_STRIDE]
    assert stored == [
        *((step, "train") for step in range(1, 21)),
        (30, "train"), (40, "train"), (50, "train"), (60, "epoch_end"), (60, "train"),
        (100, "train"), *((step, "train") for step in range(101, 106)),
    ]  # fmt: skip
    task.refresh_from_db()
    assert task.points_shed == len(left_out) == 36 and task.facts == {"replicas": 2}
    # An older report delivered again (its running total lower) changes nothing.
    ingest.store_reports([(TASK_METRICS, envelope(host, token, {"task_id": task.pk, "attempt": 1, "events": [],
                                                                "shed": 4}))])  # fmt: skip
    task.refresh_from_db()
    assert task.points_shed == 36
    client.force_login(owner)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert (
        "While the metrics ingest was far behind, the agents sent only every 10th step of the step-level points "
        "(and every epoch end): 36 points were left out." in page
    )


def test_a_stream_that_is_not_backed_up_loses_nothing(stream, running, redis_url, monkeypatch):
    client_redis, name = stream
    _owner, host, token, job, task = running
    monkeypatch.setattr(outbox_module, "SHED_BACKLOG", BACKLOG)
    app = Celery("backpressure-test", broker=broker_user(redis_url, host.name, token), set_as_current=False)
    out = Outbox(app, host.name, agent_mac_key(token, host.name))
    ingest_reader = consumer(client_redis, name)
    try:
        for first in range(1, 200, 20):  # the ingest keeps up: at most one entry waits
            report(out, task, [metric(step) for step in range(first, first + 20)])
            while ingest_reader.drain_once():
                pass
    finally:
        out.stop()

    assert sorted(MetricPoint.objects.filter(job=job).values_list("step", flat=True)) == list(range(1, 201))
    task.refresh_from_db()
    assert task.points_shed == 0 and out.metrics_backlog <= 1
