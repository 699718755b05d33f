"""The outbox keeps agent reports in order through a broker outage, never blocking or raising into the caller."""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any

import redis
from celery import Celery

from contracts import broker
from contracts.bundles import HOST_REPORTS
from contracts.protocol import HOST_SAMPLES, TASK_EVENT, TASK_LOGS, TASK_METRICS
from contracts.signing import agent_mac_key, open_sealed
from tests.support.processes import wait_until
from tests.support.redis_server import RedisServer
from tests.support.wire import broker_user
from worker_agent.outbox import Outbox

UNUSED_APP = Celery(
    "outbox-test", broker="redis://127.0.0.1:1/0", set_as_current=False
)  # never reached: the transport is injected


class FlakyTransport:
    """Fails the first `failures` publishes like a broker that is down, then delivers."""

    def __init__(self, failures: int = 0) -> None:
        self.failures_left = failures
        self.attempts: list[tuple[float, int]] = []  # (monotonic time, message number)
        self.delivered: list[tuple[str, dict[str, Any]]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, task_name: str, envelope: dict[str, Any], queue: str = broker.EVENTS) -> None:
        self.gate.wait()
        self.attempts.append((time.monotonic(), body_of(envelope)["n"]))
        if self.failures_left > 0:
            self.failures_left -= 1
            raise ConnectionRefusedError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        self.delivered.append((task_name, envelope))

    def numbers(self) -> list[int]:
        return [body_of(envelope)["n"] for _, envelope in self.delivered]


TOKEN = "tfa_token"
KEY = agent_mac_key(TOKEN, "gpu-1")


def host_url(server: RedisServer, host: str, token: str) -> str:
    """The URL `host`'s agent signs in to `server` with (contracts/broker.py)."""
    mac_key = agent_mac_key(token, host)
    return broker.server_url(broker.without_credentials(server.url), host, broker.password(mac_key, host))


def body_of(envelope: dict) -> object:
    """What a sealed envelope carries (unverified: these tests look at order and content)."""
    return json.loads(envelope["signed"])["body"]


def test_it_wraps_each_body_in_the_host_envelope():
    transport = FlakyTransport()
    outbox = Outbox(UNUSED_APP, "gpu-1", KEY, transport=transport)

    outbox.send(TASK_EVENT, {"n": 0})

    assert outbox.flush(5)
    [(name, envelope)] = transport.delivered
    assert name == TASK_EVENT
    opened = open_sealed(envelope, KEY, TASK_EVENT, max_age_s=5)  # sealed under the host's key, fresh
    assert (opened.host, opened.body) == ("gpu-1", {"n": 0})
    assert set(envelope) == {"host", "signed", "mac"}
    outbox.stop()


def test_it_retries_the_oldest_message_first_and_keeps_the_order():
    transport = FlakyTransport(failures=4)
    outbox = Outbox(UNUSED_APP, "gpu-1", KEY, transport=transport)

    for n in range(10):
        outbox.send(TASK_LOGS if n % 2 else TASK_EVENT, {"n": n})

    assert outbox.flush(10)
    assert transport.numbers() == list(range(10))
    assert [n for _, n in transport.attempts[:5]] == [0] * 5  # nothing overtakes a message that failed
    assert outbox.failures == 4 and outbox.sent == 10
    outbox.stop()


def test_its_backoff_grows_and_stays_under_the_cap():
    transport = FlakyTransport(failures=8)
    outbox = Outbox(UNUSED_APP, "gpu-1", KEY, transport=transport, max_backoff_s=0.2)

    outbox.send(TASK_EVENT, {"n": 0})

    assert outbox.flush(10)
    times = [at for at, _ in transport.attempts]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(gaps) == 8
    assert gaps[0] < gaps[2]  # 0.05 s, then 0.2 s: it backs off
    assert all(gap < 0.2 + 0.3 for gap in gaps)  # ... but never doubles past the cap (0.4, 0.8, ...)
    assert gaps[-1] >= 0.2 - 0.01


def test_send_never_blocks_or_raises_while_the_broker_hangs():
    transport = FlakyTransport()
    transport.gate.clear()  # the first publish hangs, as a connect to a black-holed broker would
    outbox = Outbox(UNUSED_APP, "gpu-1", KEY, transport=transport)

    started = time.monotonic()
    for n in range(100):
        outbox.send(TASK_EVENT, {"n": n})
    outbox.send(TASK_EVENT, {"n": object()})  # not even JSON: still no exception here

    assert time.monotonic() - started < 0.5
    assert not outbox.flush(0.2)
    assert outbox.pending() == 101
    transport.gate.set()
    assert outbox.flush(5)
    assert outbox.dropped == 1  # what cannot be sealed is dropped (logged), not retried forever
    outbox.stop()


def test_a_full_outbox_drops_log_batches_before_events():
    transport = FlakyTransport()
    transport.gate.clear()
    outbox = Outbox(UNUSED_APP, "gpu-1", KEY, transport=transport, max_queued=4)

    outbox.send(TASK_EVENT, {"n": 0})  # taken by the publisher, hanging
    wait_until(lambda: outbox._in_flight, timeout=5, what="the first publish to start")
    for n, name in enumerate([TASK_LOGS, TASK_EVENT, TASK_LOGS, TASK_EVENT, TASK_EVENT], start=1):
        outbox.send(name, {"n": n})
    transport.gate.set()

    assert outbox.flush(5)
    assert transport.numbers() == [0, 2, 4, 5]  # both log batches (1, 3) went first, every event arrived
    assert outbox.dropped == 2
    outbox.stop()


def test_stop_gives_up_on_a_broker_that_never_returns():
    transport = FlakyTransport(failures=10**9)
    outbox = Outbox(UNUSED_APP, "gpu-1", KEY, transport=transport, max_backoff_s=0.05)
    outbox.send(TASK_EVENT, {"n": 0})

    assert not outbox.flush(0.3)
    outbox.stop()
    outbox.send(TASK_EVENT, {"n": 1})  # after stop: dropped with a warning, still no exception

    assert transport.delivered == []


def test_an_event_sent_while_redis_is_down_arrives_once_it_is_up(tmp_path):
    server = RedisServer(tmp_path)
    # As the agent does: signed in as its host's own user (which the control plane makes once Redis is up).
    app = Celery("outbox-redis-test", broker=host_url(server, "gpu-1", TOKEN), set_as_current=False)
    app.conf.broker_connection_timeout = 1  # fail each attempt fast; the outbox retries
    outbox = Outbox(app, "gpu-1", KEY)
    for n in range(3):
        outbox.send(TASK_EVENT, {"n": n})

    wait_until(lambda: outbox.failures >= 1, timeout=15, what="a failed publish while nothing listens")
    assert outbox.pending() == 3
    server.start()
    try:
        broker_user(server.url, "gpu-1", TOKEN)
        assert outbox.flush(20)
        entries = redis.Redis.from_url(server.url).xrange(broker.stream("gpu-1", broker.EVENTS))
    finally:
        outbox.stop()
        server.kill()

    assert [fields[b"name"].decode() for _id, fields in entries] == [TASK_EVENT] * 3
    bodies = [body_of(json.loads(fields[b"envelope"])) for _id, fields in entries]
    assert bodies == [{"n": 0}, {"n": 1}, {"n": 2}]


class QueueTransport:
    """A transport that routes by queue, as the default one (Celery's send_task) does."""

    def __init__(self) -> None:
        self.delivered: list[tuple[str, int, str]] = []  # (task name, n, queue)

    def __call__(self, task_name: str, envelope: dict[str, Any], queue: str) -> None:
        self.delivered.append((task_name, body_of(envelope)["n"], queue))


def test_each_message_goes_to_its_stream_in_order_and_the_events_stream_by_default():
    transport = QueueTransport()
    outbox = Outbox(UNUSED_APP, "gpu-1", KEY, transport=transport)

    for n in range(6):
        if n % 2:
            outbox.send(TASK_METRICS, {"n": n}, queue=broker.METRICS)
        else:
            outbox.send(TASK_EVENT, {"n": n})

    assert outbox.flush(5)
    outbox.stop()
    by_queue = {
        q: [(name, n) for name, n, queue in transport.delivered if queue == q] for q in (broker.EVENTS, broker.METRICS)
    }
    assert by_queue == {
        broker.EVENTS: [(TASK_EVENT, 0), (TASK_EVENT, 2), (TASK_EVENT, 4)],
        broker.METRICS: [(TASK_METRICS, 1), (TASK_METRICS, 3), (TASK_METRICS, 5)],
    }


def test_a_full_outbox_drops_host_samples_then_logs_before_anything_else():
    transport = FlakyTransport()
    transport.gate.clear()
    outbox = Outbox(UNUSED_APP, "gpu-1", KEY, transport=transport, max_queued=4)

    outbox.send(TASK_EVENT, {"n": 0})  # taken by the publisher, hanging
    wait_until(lambda: outbox._in_flight, timeout=5, what="the first publish to start")
    sends = [(TASK_LOGS, broker.METRICS), (HOST_SAMPLES, broker.METRICS), (TASK_METRICS, broker.METRICS),
             (TASK_EVENT, broker.EVENTS), (TASK_EVENT, broker.EVENTS)]  # fmt: skip
    for n, (name, queue) in enumerate(sends, start=1):
        outbox.send(name, {"n": n}, queue=queue)
    transport.gate.set()

    assert outbox.flush(5)
    assert transport.numbers() == [0, 3, 4, 5]  # the sample (2) went first, then the log batch (1)
    outbox.stop()


def test_each_kind_of_traffic_lands_in_its_stream_of_the_hosts_own(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    outbox = Outbox(Celery("outbox-queues-test", broker=host_url(server, "gpu-1", TOKEN), set_as_current=False),
                    "gpu-1", KEY)  # fmt: skip
    try:
        broker_user(server.url, "gpu-1", TOKEN)
        outbox.send(TASK_EVENT, {"n": 0})
        outbox.send(HOST_SAMPLES, {"n": 1}, queue=broker.METRICS)
        for n in range(2, 302):
            outbox.send(TASK_METRICS, {"n": n}, queue=broker.METRICS)
        assert outbox.flush(20)
        client = redis.Redis.from_url(server.url)
        events = client.xrange(broker.stream("gpu-1", broker.EVENTS))
        entries = client.xrange(broker.stream("gpu-1", broker.METRICS))
    finally:
        outbox.stop()
        server.kill()

    assert [fields[b"name"].decode() for _id, fields in events] == [TASK_EVENT]
    sealed = [(fields[b"name"].decode(), json.loads(fields[b"envelope"])) for _id, fields in entries]
    assert all(open_sealed(envelope, KEY, name, max_age_s=60).host == "gpu-1" for name, envelope in sealed)
    # Metric traffic waiting together travels in bundles (one MAC, one entry; contracts/bundles.py), a lone report as
    # itself; either way each report in the order it was made.
    reports = [
        (name, body["n"])
        for outer, envelope in sealed
        for name, body in (body_of(envelope)["reports"] if outer == HOST_REPORTS else [[outer, body_of(envelope)]])
    ]
    assert reports == [(HOST_SAMPLES, 1), *((TASK_METRICS, n) for n in range(2, 302))]


def test_a_follow_up_runs_once_its_message_is_published_in_order_and_never_for_a_dropped_one():
    transport = FlakyTransport(failures=3)
    transport.gate.clear()
    outbox = Outbox(UNUSED_APP, "gpu-1", KEY, transport=transport, max_queued=3)
    done: list[int] = []

    outbox.send(TASK_EVENT, {"n": 0}, then=lambda: done.append(0))  # taken by the publisher, hanging
    wait_until(lambda: outbox._in_flight, timeout=5, what="the first publish to start")
    for n in range(1, 4):
        outbox.send(TASK_LOGS if n == 1 else TASK_EVENT, {"n": n}, then=lambda n=n: done.append(n))
    assert done == []  # nothing published yet (the output position behind a log batch is not persisted early)
    transport.gate.set()

    assert outbox.flush(10)  # returns only once the follow-ups have run
    assert transport.numbers() == [0, 2, 3]  # the log batch (1) was dropped: the outbox was full
    assert done == [0, 2, 3]
    outbox.stop()
