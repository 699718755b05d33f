"""The ingest consumer against real Redis and PostgreSQL: reports an agent's outbox put on the stream are stored once,
acknowledged only after the commit, re-read after a crash, and a bad report never blocks the ones behind it."""

from __future__ import annotations

import json
import time

import pytest
import redis
from celery import Celery

from contracts import broker
from contracts.protocol import METRICS_GROUP, TASK_METRICS
from contracts.signing import agent_mac_key
from orchestrator.identity import auth
from orchestrator.metrics.stream import DEAD_LETTERED, DEAD_LETTERS
from orchestrator.models import MetricPoint
from orchestrator.plumbing import counters
from tests.orchestrator.metrics.conftest import consumer
from tests.support.processes import wait_until
from tests.support.wire import broker_user, sealed
from worker_agent.outbox import Outbox

pytestmark = pytest.mark.django_db(transaction=True)


def metric(step: int, **values: float) -> dict:
    return {"kind": "metric", "ts": time.time(), "mono": 1.0, "step": step, "epoch": 0, "phase": "train",
            "metrics": values}  # fmt: skip


def add(client: redis.Redis, stream: str, host, token: str, body: dict) -> None:  # type: ignore[no-untyped-def]
    envelope = sealed(host.name, token, TASK_METRICS, body)
    client.xadd(stream, {"name": TASK_METRICS, "envelope": json.dumps(envelope)})


def test_what_an_agent_outbox_sends_is_stored_and_leaves_the_stream(stream, running, redis_url):
    client, name = stream
    _owner, host, token, job, task = running
    ingest = consumer(client, name)
    # As the agent does: signed in as its host's own broker user.
    app = Celery("stream-test", broker=broker_user(redis_url, host.name, token), set_as_current=False)
    outbox = Outbox(app, host.name, agent_mac_key(token, host.name))
    for step in range(1, 301):
        outbox.send(TASK_METRICS, {"task_id": task.pk, "attempt": 1, "events": [metric(step, loss=1 / step)]},
                    queue=broker.METRICS)  # fmt: skip
    assert outbox.flush(20)
    outbox.stop()

    while ingest.drain_once():
        pass

    assert sorted(MetricPoint.objects.filter(job=job).values_list("step", flat=True)) == list(range(1, 301))
    assert client.xlen(name) == 0  # acknowledged and deleted once stored
    assert client.xpending(name, METRICS_GROUP)["pending"] == 0


def test_entries_read_but_never_acknowledged_are_stored_once_by_the_next_run(stream, running):
    client, name = stream
    _owner, host, token, job, task = running
    first = consumer(client, name)
    add(client, name, host, token, {"task_id": task.pk, "attempt": 1, "events": [metric(1, loss=1.0)]})
    first.drain_once()
    ids_before = list(MetricPoint.objects.filter(job=job).values_list("id", flat=True))
    # A crash after reading (and even after storing) but before the acknowledgement: the entries stay pending.
    add(client, name, host, token, {"task_id": task.pk, "attempt": 1, "events": [metric(1, loss=1.0), metric(2)]})
    add(client, name, host, token, {"task_id": task.pk, "attempt": 1, "events": [metric(2, loss=0.5)]})
    client.xreadgroup(METRICS_GROUP, "ingest", {name: ">"}, count=10)
    assert client.xpending(name, METRICS_GROUP)["pending"] == 2

    restarted = consumer(client, name)
    assert restarted.drain_once(backlog=True) == 2

    points = list(MetricPoint.objects.filter(job=job).order_by("step").values_list("id", "step", "value"))
    assert [(step, value) for _id, step, value in points] == [(1, 1.0), (2, 0.5)]
    assert points[0][0] == ids_before[0]  # the redelivered point kept its id: a page drops it as already seen
    assert client.xpending(name, METRICS_GROUP)["pending"] == 0


def test_forged_entries_are_dropped_broken_ones_dead_lettered_and_neither_blocks_the_rest(stream, running):
    client, name = stream
    _owner, host, token, job, task = running
    ingest = consumer(client, name)
    refused = counters.get(auth.REFUSED)
    dead = counters.get(DEAD_LETTERED)
    add(client, name, host, "tfa_forged", {"task_id": task.pk, "attempt": 1, "events": [metric(1, loss=9.0)]})
    client.xadd(name, {"name": TASK_METRICS, "envelope": "{not json"})
    add(client, name, host, token, {"task_id": task.pk, "attempt": 1, "events": [metric(2**70, loss=1.0)]})
    add(client, name, host, token, {"task_id": task.pk, "attempt": 1, "events": [metric(3, loss=0.3)]})

    ingest.drain_once()

    assert list(MetricPoint.objects.filter(job=job).values_list("step", "value")) == [(3, 0.3)]
    assert counters.get(auth.REFUSED) == refused + 1
    assert counters.get(DEAD_LETTERED) == dead + 1
    assert [fields[b"envelope"] for _id, fields in client.xrange(DEAD_LETTERS)] == [b"{not json"]
    assert client.xlen(name) == 0


def test_the_consumer_recreates_its_group_when_redis_lost_it(stream, running):
    import threading

    client, name = stream
    _owner, host, token, job, task = running
    ingest = consumer(client, name)
    stop = threading.Event()
    thread = threading.Thread(target=ingest.run, args=(stop,), daemon=True)
    thread.start()
    try:
        add(client, name, host, token, {"task_id": task.pk, "attempt": 1, "events": [metric(1, loss=1.0)]})
        wait_until(lambda: MetricPoint.objects.filter(job=job).count() == 1, timeout=10, what="the first point")
        client.delete(name)  # what a Redis restart without persistence leaves: no stream, no group
        add(client, name, host, token, {"task_id": task.pk, "attempt": 1, "events": [metric(2, loss=0.5)]})
        wait_until(lambda: MetricPoint.objects.filter(job=job).count() == 2, timeout=15, what="the point after")
    finally:
        stop.set()
        thread.join(10)
