"""A host's stream entries are fresh when appended and appended once (orchestrator/identity/stream_marks.py): the ingest
refuses, logs and counts an entry appended longer than TFDASH_STREAM_MAX_AGE_S after it was sealed, and an earlier
entry's bytes appended again, while entries that waited in the stream for the ingest, or in an agent's outbox for
Redis, longer than that bound are stored. Real Redis, real PostgreSQL, the ingest's own reader."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from django.conf import settings as django_settings

from contracts import broker
from contracts.protocol import TASK_METRICS
from contracts.signing import agent_mac_key
from orchestrator.identity import auth
from orchestrator.models import Job, MetricPoint, Task
from orchestrator.plumbing import counters
from tests.orchestrator.metrics.conftest import consumer
from tests.support.processes import wait_until
from tests.support.redis_server import RedisServer
from tests.support.wire import broker_user, sealed
from worker_agent.outbox import Outbox

pytestmark = pytest.mark.django_db(transaction=True)


def report(task: Task, step: int, loss: float) -> dict[str, Any]:
    event = {"kind": "metric", "ts": time.time(), "mono": 1.0, "step": step, "epoch": 0, "phase": "train",
             "metrics": {"loss": loss}}  # fmt: skip
    return {"task_id": task.pk, "attempt": 1, "events": [event]}


def entry(envelope: dict[str, Any]) -> dict[str, str]:
    """A stream entry as the outbox adds it; the same dict appended twice is the same sealed bytes twice."""
    return {"name": TASK_METRICS, "envelope": json.dumps(envelope)}


def drain(reader: Any) -> None:
    while reader.drain_once():
        pass


def losses(job: Job) -> dict[int, float]:
    return dict(MetricPoint.objects.filter(job=job, name="loss").values_list("step", "value"))


def test_the_bound_is_minutes_not_a_week():
    assert 30 <= django_settings.TFDASH_STREAM_MAX_AGE_S <= 300


def test_an_entry_sealed_longer_ago_than_the_bound_is_refused_and_counted(stream, running):
    client, name = stream
    _owner, host, token, job, task = running
    stale = counters.get(auth.STALE)
    old = time.time() - 900  # captured a quarter of an hour ago (more than the bound: see above), appended now
    client.xadd(name, entry(sealed(host.name, token, TASK_METRICS, report(task, 1, 9.0), now=old)))
    client.xadd(name, entry(sealed(host.name, token, TASK_METRICS, report(task, 2, 0.5))))

    drain(consumer(client, name))

    assert losses(job) == {2: 0.5}
    assert counters.get(auth.STALE) == stale + 1
    assert client.xlen(name) == 0  # refused and acknowledged: nothing left to block the stream


def test_an_entry_appended_again_is_refused_stores_nothing_and_a_fresh_one_goes_through(stream, running):
    client, name = stream
    _owner, host, token, job, task = running
    reader = consumer(client, name)
    first = entry(sealed(host.name, token, TASK_METRICS, report(task, 1, 1.0)))
    corrected = entry(sealed(host.name, token, TASK_METRICS, report(task, 1, 0.5)))  # step 1 again, later
    client.xadd(name, first)
    client.xadd(name, corrected)
    drain(reader)
    assert losses(job) == {1: 0.5}
    replayed = counters.get(auth.REPLAYED)

    client.xadd(name, first)  # the first entry's bytes again, in a later read: it would put 1.0 back
    drain(reader)
    assert losses(job) == {1: 0.5}
    client.xadd(name, corrected)  # and the newest entry's, with a fresh one behind it in the same read
    client.xadd(name, entry(sealed(host.name, token, TASK_METRICS, report(task, 2, 0.25))))
    drain(consumer(client, name))  # another reader (the ingest restarted): the marks are Redis'

    assert losses(job) == {1: 0.5, 2: 0.25}
    assert counters.get(auth.REPLAYED) == replayed + 2
    assert client.xlen(name) == 0


def test_an_entry_that_waited_in_the_stream_longer_than_the_bound_is_stored(stream, running):
    """The ingest was down for an hour: the entry's age is measured to when Redis appended it, not to the read."""
    client, name = stream
    _owner, host, token, job, task = running
    appended = time.time() - 3600
    envelope = sealed(host.name, token, TASK_METRICS, report(task, 1, 0.75), now=appended - 1)
    client.xadd(name, entry(envelope), id=f"{int(appended * 1000)}-0")  # the id Redis gave it an hour ago

    drain(consumer(client, name))

    assert losses(job) == {1: 0.75}


def test_reports_held_in_the_outbox_through_an_outage_longer_than_the_bound_arrive(stream, running, tmp_path, settings):
    """The outbox seals a report as it leaves, not as it is queued: a report queued while Redis is down, for longer
    than the bound, is stored once Redis is back. A report sealed when it was queued would be refused."""
    settings.TFDASH_STREAM_MAX_AGE_S = 1.0
    _client, name = stream
    _owner, host, token, job, task = running
    server = RedisServer(tmp_path)
    app = Celery("freshness-test", broker=_host_url(server, host.name, token), set_as_current=False)
    app.conf.broker_connection_timeout = 1
    outbox = Outbox(app, host.name, agent_mac_key(token, host.name))
    queued_at = time.time()
    sealed_when_queued = sealed(host.name, token, TASK_METRICS, report(task, 2, 9.0), now=queued_at)
    outbox.send(TASK_METRICS, report(task, 1, 0.5), queue=broker.METRICS)
    wait_until(
        lambda: outbox.failures >= 1 and time.time() > queued_at + 2 * settings.TFDASH_STREAM_MAX_AGE_S,
        timeout=30,
        what="an outage twice the bound",
    )
    assert outbox.pending() == 1
    server.start()
    try:
        broker_user(server.url, host.name, token)
        assert outbox.flush(20)
        client = redis.Redis.from_url(server.url)
        client.xadd(name, entry(sealed_when_queued))
        stale = counters.get(auth.STALE)
        drain(consumer(client, name))
    finally:
        outbox.stop()
        server.kill()

    assert losses(job) == {1: 0.5}
    assert counters.get(auth.STALE) == stale + 1


def _host_url(server: RedisServer, host: str, token: str) -> str:
    """The URL `host`'s agent signs in to `server` with (contracts/broker.py)."""
    mac_key = agent_mac_key(token, host)
    return broker.server_url(broker.without_credentials(server.url), host, broker.password(mac_key, host))


def test_an_agent_clock_stepped_back_loses_no_report(stream, running, redis_url, monkeypatch):
    """NTP steps a host's clock back 30 s between two reports: the outbox seals the second no earlier than the first,
    so the ingest does not take it for an earlier entry appended again."""
    from worker_agent import outbox as outbox_module

    client, name = stream
    _owner, host, token, job, task = running
    step_back = {"s": 0.0}
    clock = SimpleNamespace(time=lambda: time.time() - step_back["s"], monotonic=time.monotonic)
    monkeypatch.setattr(outbox_module, "time", clock)
    app = Celery("clock-test", broker=broker_user(redis_url, host.name, token), set_as_current=False)
    outbox = Outbox(app, host.name, agent_mac_key(token, host.name))
    replayed = counters.get(auth.REPLAYED)
    try:
        outbox.send(TASK_METRICS, report(task, 1, 1.0), queue=broker.METRICS)
        assert outbox.flush(20)
        step_back["s"] = 30.0
        outbox.send(TASK_METRICS, report(task, 2, 0.5), queue=broker.METRICS)
        assert outbox.flush(20)
    finally:
        outbox.stop()

    drain(consumer(client, name))

    assert losses(job) == {1: 1.0, 2: 0.5}
    assert counters.get(auth.REPLAYED) == replayed
