"""Agent -> orchestrator messages that survive a broker blip.

`send` only appends to an in-memory queue; one background thread publishes in order and retries the head of the queue
(backoff up to 2 s) while Redis is down, so an `exited` event is delayed by an outage, not lost. The queue is bounded:
when it is full the oldest host sample batch, then the oldest log batch, is dropped first, because a lost sample or log
line costs less than a lost task event.

Each message names the stream of this host's it goes to (contracts/broker.py: EVENTS, the default, for the hello and
task events; METRICS for metric points, log lines, host samples and artifacts): every message is an entry of one of
the host's own streams, the only keys besides its order queue that its broker user may write. One ordered outbox
serves both: that keeps the order within each stream, which is all the consumers rely on. Messages that wait together
at the head go out in one pipelined round trip, so under load they batch by themselves while a lone event still
leaves at once (no flush timer adds latency). Metric points, log lines and host samples waiting together go as one
sealed entry (contracts/bundles.py: one MAC, one XADD, in the order they were made); when such a report is at the
head the thread lingers up to BUNDLE_LINGER_S for others to join it.

Backpressure: every round trip that adds to the METRICS stream also reads its length (XLEN, its own key). While the
ingest leaves SHED_BACKLOG entries or more unstored there, the metric reports that go out carry only every
SHED_STRIDE-th step of the step-level points (epoch ends and facts always), and each task attempt's running total of
points left out rides in its reports (contracts/protocol.py `shed_step_points`, TaskMetricsBatch.shed): the job page
says how many, nothing is dropped unsaid.

Every message is sealed (contracts/signing.py: host, time, nonce, name, body, MAC under the host's key) when it is
published, not when it is queued: a message held back by a broker outage leaves with a fresh timestamp, so it is not
refused as stale. The outbox holds the derived MAC key, never the token.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery

from contracts import broker
from contracts.bundles import BUNDLE_LINGER_S, BUNDLED, HOST_REPORTS, bundle_entries
from contracts.metric_messages import SHED_BACKLOG, SHED_STRIDE, shed_step_points
from contracts.protocol import HOST_SAMPLES, STREAM_MAXLEN, TASK_LOGS, TASK_METRICS, stream_entry
from contracts.signing import seal

log = logging.getLogger(__name__)

# `transport(task_name, envelope, queue=...)` publishes one message or raises.
Transport = Callable[..., None]

# (task name, body, stream, what to run once it is published)
_Item = tuple[str, dict[str, Any], str, Callable[[], None] | None, float]

# Dropped first when the outbox is full, in this order: the cheapest losses.
DROP_FIRST = (HOST_SAMPLES, TASK_LOGS)

MAX_QUEUED = 10_000
# Stream entries published in one round trip, at most (and about this many bytes of envelopes).
STREAM_BATCH = 500
STREAM_BATCH_BYTES = 4_000_000
MAX_SHED_TASKS = 10_000
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 2.0


def broker_redis(app: Celery) -> redis.Redis:
    """A client of the broker's Redis as the host's own user, for the streams the agent adds to. Short timeouts: a
    send must not hang the thread that makes it."""
    return redis.Redis.from_url(app.conf.broker_url, socket_timeout=5, socket_connect_timeout=5)


class Outbox:
    def __init__(
        self,
        app: Celery,
        host: str,
        key: bytes,
        *,
        transport: Transport | None = None,
        max_queued: int = MAX_QUEUED,
        max_backoff_s: float = MAX_BACKOFF_S,
    ) -> None:
        """`key`: the host's MAC key (contracts.signing.agent_mac_key). `transport(task_name, envelope, queue=...)`
        publishes one sealed message or raises; the default adds it to the host's stream `queue` (pipelined)."""
        self.app = app
        self.host = host
        self._key = key
        self.max_queued = max_queued
        self.max_backoff_s = max_backoff_s
        # An injected transport (tests, tools) takes every message one by one; the default adds stream entries in
        # pipelined batches.
        self._transport = transport
        self._redis: redis.Redis | None = None
        self._queue: deque[_Item] = deque()  # (name, body, stream kind, then, queued at: monotonic)
        self._cond = threading.Condition()
        self._in_flight = 0  # messages at the head being published
        self._following = False  # a batch taken, its follow-ups not yet run
        self._stopped = False
        self.sent = 0
        self.dropped = 0
        self.failures = 0
        self.metrics_backlog = 0  # entries in the host's METRICS stream at the last round trip that added to it
        self._sealed_at = 0.0  # the last seal's time: seals never go back (see _now)
        self._shed: dict[tuple[Any, Any], int] = {}  # (task, attempt) -> step-level points left out so far
        self._thread = threading.Thread(target=self._run, name="outbox", daemon=True)
        self._thread.start()

    # --- caller side ----------------------------------------------------------------------------------------------
    def send(
        self, task_name: str, body: dict[str, Any], queue: str = broker.EVENTS, then: Callable[[], None] | None = None
    ) -> None:
        """Queue one message for this host's stream `queue` (broker.EVENTS or broker.METRICS); never blocks on the
        broker and never raises. `then` runs on the publishing thread once the message is published (in order; not
        at all when it is dropped)."""
        try:
            with self._cond:
                if self._stopped:
                    log.warning("outbox stopped: dropping %s", task_name)
                    return
                if len(self._queue) >= self.max_queued:
                    self._drop_one()
                self._queue.append((task_name, body, queue, then, time.monotonic()))
                self._cond.notify_all()
        except Exception:  # a reporting path must never break the code that reports
            log.exception("outbox could not queue %s", task_name)

    def flush(self, timeout: float) -> bool:
        """Wait until every queued message is published; False when some are still unsent after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._in_flight or self._following:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(left)
        return True

    def stop(self, timeout: float = 2.0) -> None:
        """Stop publishing; whatever is still queued is dropped (call `flush` first to give it a chance)."""
        with self._cond:
            self._stopped = True
            unsent = len(self._queue)
            self._cond.notify_all()
        self._thread.join(timeout)
        if unsent:
            log.warning("outbox stopped with %d unsent message(s)", unsent)

    def pending(self) -> int:
        """Messages not yet published (the one being published stays at the head until it is)."""
        with self._cond:
            return len(self._queue)

    # --- publishing thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = FIRST_BACKOFF_S
        while True:
            with self._cond:
                while not self._queue and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                linger = self._linger()
                if linger > 0:
                    self._cond.wait(linger)  # more reports may join the bundle; woken early by stop() or a send
                    continue
                batch = self._head_batch()
                self._in_flight = len(batch)
                self._following = True
            ok = self._publish_batch(batch)
            with self._cond:
                if ok:
                    # Only now leave the queue: a failed head is retried before anything behind it, keeping order.
                    for item in batch:
                        if self._queue and self._queue[0] is item:
                            self._queue.popleft()
                    self.sent += len(batch)
                    backoff = FIRST_BACKOFF_S
                self._in_flight = 0
            if ok:
                _run_callbacks(batch)  # outside the lock; `flush` returns only after them (`_following`)
            with self._cond:
                self._following = False
                self._cond.notify_all()
                if not ok:
                    self._cond.wait(backoff)  # woken early only by stop()
                    backoff = min(backoff * 2, self.max_backoff_s)

    def _linger(self) -> float:
        """How long to wait before sending, for more reports to bundle with the one at the head (called holding the
        lock): 0 unless the head is a bundled report queued less than BUNDLE_LINGER_S ago and the batch is not full."""
        name, _body, queue, _then, queued_at = self._queue[0]
        if self._transport is not None or queue != broker.METRICS or name not in BUNDLED:
            return 0.0
        if len(self._queue) >= STREAM_BATCH:
            return 0.0
        return max(0.0, queued_at + BUNDLE_LINGER_S - time.monotonic())

    def _head_batch(self) -> list[_Item]:
        """The head message, plus those right behind it up to a batch (called holding the lock)."""
        if self._transport is not None:
            return [self._queue[0]]
        batch, size = [], 0
        for item in self._queue:
            if len(batch) >= STREAM_BATCH or size >= STREAM_BATCH_BYTES:
                break
            batch.append(item)
            size += _rough_size(item[1])
        return batch

    def _publish_batch(self, batch: list[_Item]) -> bool:
        if self._transport is not None:
            return self._publish(*batch[0][:3])
        try:
            self._xadd(batch)
        except Exception as exc:  # Redis down or refusing: retried with backoff, the same batch or a longer one
            self.failures += 1
            if self.failures == 1 or self.failures % 20 == 0:
                log.warning("could not send %d report(s) (%d failures so far, retrying): %s", len(batch),
                            self.failures, exc)  # fmt: skip
            return False
        return True

    def _xadd(self, batch: list[_Item]) -> None:
        if self._redis is None:
            self._redis = broker_redis(self.app)
        pipe = self._redis.pipeline(transaction=False)
        run: list[tuple[str, Any]] = []  # bundled reports waiting to be packed: a run ends at an artifact

        def add(queue: str, entry: dict[str, str]) -> None:
            pipe.xadd(broker.stream(self.host, queue), entry, maxlen=STREAM_MAXLEN[queue], approximate=True)

        for name, body, queue, _then, _queued_at in batch:
            if queue == broker.METRICS and name == TASK_METRICS and isinstance(body, dict):
                self._shed_from(body)
            if queue == broker.METRICS and name in BUNDLED:
                run.append((name, body))
                continue
            if queue == broker.METRICS and run:  # what was reported before this artifact goes before it
                for entry in bundle_entries(run, self._seal_quietly):
                    add(queue, entry)
                run = []
            envelope = self._seal(name, body)
            if envelope is not None:
                add(queue, stream_entry(name, envelope))
        for entry in bundle_entries(run, self._seal_quietly):
            add(broker.METRICS, entry)
        metrics = any(queue == broker.METRICS for _name, _body, queue, _then, _at in batch)
        if metrics:
            pipe.xlen(broker.stream(self.host, broker.METRICS))
        replies = pipe.execute()
        if metrics:
            self.metrics_backlog = int(replies[-1])

    def _shed_from(self, body: dict[str, Any]) -> None:
        """While the metrics stream is backed up, thin the report's step-level points; every report of a task attempt
        that has had points left out carries its running total (the last one sent is the one that counts)."""
        key = (body.get("task_id"), body.get("attempt"))
        if self.metrics_backlog >= SHED_BACKLOG and isinstance(body.get("events"), list):
            body["events"], shed = shed_step_points(body["events"])
            if shed:
                if key not in self._shed:
                    log.warning("the ingest is %d entries behind: sending every %dth step only (epoch ends all)",
                                self.metrics_backlog, SHED_STRIDE)  # fmt: skip
                self._shed[key] = self._shed.get(key, 0) + shed
                if len(self._shed) > MAX_SHED_TASKS:  # an agent up for months: the oldest attempts are long over
                    del self._shed[next(iter(self._shed))]
        if key in self._shed:
            body["shed"] = self._shed[key]

    def _seal_quietly(self, name: str, body: Any) -> dict[str, Any] | None:
        """`_seal` for bundle_entries: a bundle that cannot be sealed is split, and only a lone report that cannot be
        is dropped (and counted)."""
        if name != HOST_REPORTS:
            return self._seal(name, body)
        try:
            return seal(self._key, self.host, name, body, now=self._now())
        except (TypeError, ValueError):
            return None

    def _seal(self, name: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The message sealed now (a fresh timestamp however long it waited here); None, logged and counted as
        dropped, when the body cannot be sealed (not JSON): retrying it would block everything behind it."""
        try:
            return seal(self._key, self.host, name, body, now=self._now())
        except (TypeError, ValueError) as exc:
            self.dropped += 1
            log.warning("dropped a %s that cannot be sent: %s", name, exc)
            return None

    def _now(self) -> float:
        """The time to seal with: the clock, but never before the last seal's. The ingest refuses an entry sealed
        before one appended ahead of it as a replay (orchestrator/identity/stream_marks.py), so a clock stepped
        back must not make the next reports look older than those already sent."""
        self._sealed_at = max(time.time(), self._sealed_at)
        return self._sealed_at

    def _publish(self, task_name: str, body: dict[str, Any], queue: str) -> bool:
        envelope = self._seal(task_name, body)
        if envelope is None:
            return True  # dropped: done with it
        assert self._transport is not None
        try:
            self._transport(task_name, envelope, queue=queue)
        except Exception as exc:  # broker down or refusing: retried with backoff
            self.failures += 1
            if self.failures == 1 or self.failures % 20 == 0:
                log.warning("could not send %s (%d failures so far, retrying): %s", task_name, self.failures, exc)
            return False
        return True

    def _drop_one(self) -> None:
        # Never drop a message being published (the thread pops them by identity afterwards).
        start = self._in_flight
        victim = next(
            (i for name in DROP_FIRST for i in range(start, len(self._queue)) if self._queue[i][0] == name), None
        )
        if victim is None:
            if len(self._queue) <= start:
                return
            victim = start
        del self._queue[victim]
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 100 == 0:
            log.warning("outbox full (%d queued): dropped %d message(s) so far", self.max_queued, self.dropped)


def _run_callbacks(batch: list[_Item]) -> None:
    for item in batch:
        if item[3] is not None:
            try:
                item[3]()
            except Exception:  # a caller's follow-up must not stop the publishing thread
                log.exception("a follow-up of a published %s failed", item[0])


def _rough_size(body: dict[str, Any]) -> int:
    """A cheap upper-ish estimate of a message's JSON size, to keep one pipelined batch reasonable."""
    if isinstance(body, dict):
        events = body.get("events") or body.get("samples") or ()
        return 200 + 200 * len(events) + len(body.get("content_b64") or "")
    return 200
