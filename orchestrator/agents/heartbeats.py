"""Heartbeats in batches: the reader of the agents' heartbeat stream (contracts/protocol.py HEARTBEAT_STREAM).

500 hosts beating every 3 s are ~170 reports a second; as Celery messages, one handler run each, they cost about two
thirds of a core (bench/scale.py). Read a few hundred at a time, a batch costs:
- one query for the hosts and one Redis round trip for the nonces (orchestrator/agents/auth.py authenticate_batch);
- one UPDATE of `last_heartbeat` for every host whose report only says "still here, same facts" (the steady case),
  and the full per-host path (orchestrator/agents/reports.py) for the few whose facts or status change;
- one query for the tasks of every reporting host, compared in memory with each report
  (orchestrator/agents/reconcile.py); only a host whose report disagrees costs statements of its own;
- one round trip for the report lags, one to remember the nonces, one to acknowledge and delete the entries.

Every orchestrator worker runs one reader (a thread, started with the worker: `start_reader`), each a consumer of
its own name in the group, so adding orchestrator workers adds readers. An entry is acknowledged after its batch
was applied; one read but never acknowledged (the worker died) is read again by its consumer when it comes back, or
claimed by another reader once it has sat idle for a while. Either way it is by then stale and dropped: a heartbeat
is worth something only while it is fresh, and the next one from the same host follows within seconds.

The watchdog judges no host while a heartbeat has waited unapplied for long (`unapplied_age_s`: no reader reads, or
one is stuck holding a batch): the silence could then be this side's, not the host's.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis
from django.db import DatabaseError, connection
from django.db.models import F, FloatField, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from contracts.protocol import AGENT_HEARTBEAT, HEARTBEAT_GROUP, HEARTBEAT_STREAM, HostFacts, read_stream_entry
from orchestrator import counters
from orchestrator.agents import auth, reconcile, reports
from orchestrator.models import Host, HostStatus

log = logging.getLogger(__name__)

READ_COUNT = 1000
BLOCK_MS = 500
CLAIM_IDLE_MS = 20_000  # entries another reader took and left this long are taken over (and dropped as stale)
CLAIM_EVERY_S = 5.0
MAX_BACKOFF_S = 1.0  # Redis back from a restart: the beats flow again within a second (the watchdog waits a timeout)
GATHER_S = 0.5  # between reads, while they are not full: beats gather into batches (and wait at most this long)


def apply_batch(payloads: list[Any]) -> int:
    """Apply a batch of sealed heartbeats; returns how many were accepted."""
    accepted = auth.authenticate_batch(payloads, AGENT_HEARTBEAT)
    if not accepted:
        return 0
    # The newest report per host: each says the agent's whole truth, an older one in the same batch adds nothing.
    newest: dict[int, auth.Accepted] = {}
    for one in accepted:
        seen = newest.get(one.host.pk)
        if seen is None or one.message.ts > seen.message.ts:
            newest[one.host.pk] = one
    lags: dict[str, float] = {}
    checked = []
    for one in newest.values():
        facts = reports.check(one.host, one.message.ts, one.message.body, lags)
        if facts is not None:
            checked.append((one.host, facts, one.message.body, one.message.ts))
    counters.record_readings(reports.REPORT_LAG, lags)

    steady: list[Host] = []
    changed: list[tuple[Host, HostFacts, float]] = []
    for host, facts, _body, sent_at in checked:
        if host.says_the_same(facts):
            steady.append(host)
        else:
            changed.append((host, facts, sent_at))
    if steady:
        ids = [host.pk for host in steady]
        # The stored facts are confirmed as of these reports: their sealed time moves on too (to the batch's oldest,
        # which none of them is older than), so a late report of older facts cannot undo them.
        confirmed_at = Value(min(sent_at for _h, _f, _b, sent_at in checked), output_field=FloatField())
        updated = Host.objects.filter(pk__in=ids, status=HostStatus.ONLINE).update(
            last_heartbeat=timezone.now(), facts_at=Greatest(F("facts_at"), confirmed_at)
        )
        if updated != len(ids):
            # Flipped offline by the watchdog since they were read: the full path brings them back, saying so.
            back = set(Host.objects.filter(pk__in=ids).exclude(status=HostStatus.ONLINE).values_list("pk", flat=True))
            by_pk = {host.pk: (host, facts, sent_at) for host, facts, _body, sent_at in checked}
            for pk in back:
                host, facts, sent_at = by_pk[pk]
                host.status = HostStatus.OFFLINE
                changed.append((host, facts, sent_at))
    for host, facts, sent_at in changed:
        reports.record(host, facts, hello=False, sent_at=sent_at)

    task_reports = [(host, report) for host, _f, body, _t in checked if (report := reports.task_report(host, body))]
    rows = reconcile.rows_of(task_reports)
    for host, report in task_reports:
        try:
            reconcile.converge(host, report, rows[host.pk])
        except DatabaseError:
            raise  # the whole batch is read again
        except Exception:  # one host's report must not keep the others' from being applied
            log.exception("could not converge host %s on its heartbeat", host.name)
    auth.remember_all(accepted)
    return len(accepted)


class HeartbeatReader:
    """One consumer of the heartbeat stream (see the module's doc)."""

    def __init__(self, client: redis.Redis, consumer: str) -> None:
        self.client = client
        self.consumer = consumer

    def ensure_group(self) -> None:
        try:
            # From the start of the stream, not "$": a stream without the group is one Redis lost and made again
            # (a restart without persistence); every beat an agent added since is news, and skipping them left
            # hosts silent until their next beat. Beats too old to matter are refused as stale when applied.
            self.client.xgroup_create(HEARTBEAT_STREAM, HEARTBEAT_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def run(self, stop: threading.Event) -> None:
        backlog = True  # first what this consumer had read and not acknowledged, and what others left
        backoff = 0.05
        next_claim = 0.0
        while not stop.is_set():
            try:
                if backlog:
                    self.ensure_group()
                if backlog or time.monotonic() >= next_claim:
                    # Also from time to time: a worker that died for good leaves entries that would hold the
                    # watchdog's judgement (unapplied_age_s) until someone takes them.
                    self.take_over_abandoned()
                    next_claim = time.monotonic() + CLAIM_EVERY_S
                handled = self.drain_once(backlog=backlog)
                if backlog and handled == 0:
                    backlog = False
                backoff = 0.05
                if not backlog and handled < READ_COUNT:
                    # A blocking read returns as soon as one entry is there: without this pause a fleet's beats
                    # would come one or two per batch, each paying a batch's statements.
                    stop.wait(GATHER_S)
                continue
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("heartbeat reader: Redis unavailable (%s); retrying in %.2f s", exc, backoff)
            except redis.ResponseError as exc:
                # NOGROUP/UNBLOCKED: Redis restarted without persistence (or was flushed): make the group again.
                log.warning("heartbeat reader: Redis refused a stream command (%s); retrying", exc)
            except DatabaseError as exc:
                log.warning("heartbeat reader: database unavailable (%s); retrying in %.2f s", exc, backoff)
                connection.close()
            except Exception:
                log.exception("heartbeat reader failed; retrying in %.2f s", backoff)
            backlog = True
            stop.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        connection.close()

    def take_over_abandoned(self) -> None:
        """Claim what other readers read and never acknowledged (a worker that died for good), to drain it."""
        self.client.xautoclaim(HEARTBEAT_STREAM, HEARTBEAT_GROUP, self.consumer, CLAIM_IDLE_MS, count=READ_COUNT)

    def drain_once(self, *, backlog: bool = False, block_ms: int = BLOCK_MS) -> int:
        """Read up to READ_COUNT entries (this consumer's pending ones when `backlog`), apply them, acknowledge and
        delete them; returns how many were read."""
        response = self.client.xreadgroup(
            HEARTBEAT_GROUP,
            self.consumer,
            {HEARTBEAT_STREAM: "0" if backlog else ">"},
            count=READ_COUNT,
            block=None if backlog else block_ms,
        )
        entries: list[tuple[bytes, dict[bytes, bytes] | None]] = response[0][1] if response else []
        if not entries:
            return 0
        payloads = []
        for entry_id, fields in entries:
            if not fields:  # deleted after it was read: nothing left
                continue
            try:
                payloads.append(read_stream_entry(fields)[1])
            except (KeyError, ValueError, RecursionError) as exc:
                log.warning("heartbeat entry %s is not a sealed message: %r", entry_id.decode(errors="replace"), exc)
                counters.incr(auth.MALFORMED)
        apply_batch(payloads)
        ids = [entry_id for entry_id, _fields in entries]
        pipe = self.client.pipeline(transaction=True)
        pipe.xack(HEARTBEAT_STREAM, HEARTBEAT_GROUP, *ids)
        pipe.xdel(HEARTBEAT_STREAM, *ids)
        pipe.execute()
        return len(entries)


def unapplied_age_s(client: redis.Redis) -> float:
    """How long the oldest heartbeat not applied yet has been waiting (read by a reader and not acknowledged, or not
    read at all); 0.0 when none waits. Measured on Redis's clock, which stamped the entries. The watchdog judges no
    host while this is large: some host's report may be among those waiting (orchestrator/agents/liveness.py)."""
    now_ms = _ms(client.time())
    waiting: list[int] = []
    try:
        pending = client.xpending(HEARTBEAT_STREAM, HEARTBEAT_GROUP)
        if pending["pending"]:
            waiting.append(_entry_ms(pending["min"]))
        group = next(g for g in client.xinfo_groups(HEARTBEAT_STREAM) if _text(g["name"]) == HEARTBEAT_GROUP)
        after = "(" + _text(group["last-delivered-id"])
    except (redis.ResponseError, StopIteration):  # no group yet: no reader has ever read, all of it waits
        after = "-"
    unread = client.xrange(HEARTBEAT_STREAM, min=after, count=1)
    if unread:
        waiting.append(_entry_ms(unread[0][0]))
    return max(0.0, (now_ms - min(waiting)) / 1000) if waiting else 0.0


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entry_ms(entry_id: bytes | str) -> int:
    return int(_text(entry_id).split("-")[0])


def _ms(redis_time: tuple[int, int]) -> int:
    seconds, micros = redis_time
    return int(seconds) * 1000 + int(micros) // 1000


_started: dict[str, tuple[threading.Thread, threading.Event]] = {}


def start_reader(client: redis.Redis, consumer: str) -> threading.Event:
    """Run a reader named `consumer` in a daemon thread of this process (once per name); set the returned event to
    stop it."""
    if consumer in _started:
        return _started[consumer][1]
    stop = threading.Event()
    reader = HeartbeatReader(client, consumer)
    thread = threading.Thread(target=reader.run, args=(stop,), name=f"heartbeats-{consumer}", daemon=True)
    thread.start()
    _started[consumer] = (thread, stop)
    log.info("heartbeat reader %s started", consumer)
    return stop
