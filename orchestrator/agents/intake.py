"""The hosts' hello and task events, applied where they land: every orchestrator worker reads every host's EVENTS
stream (orchestrator/plumbing/streams.py, as the heartbeats are read: orchestrator/agents/heartbeats.py; READERS
readers per worker) and the handler here applies the entries itself, in the order read: task events in batches of
up to `events.MAX_BATCH` (a gang's events under one lock of its job, orchestrator/agents/events.py), a hello alone
(orchestrator/agents/reports.py) after the earlier events of the read, as its host sent them.

At least once, and exactly once in effect: an entry is acknowledged only after the handler returned, so after its
handling committed; each applied message's nonce is remembered once its transaction committed, and an entry read
again (a reader that died, an outage mid-batch) is refused as a replay. An outage (orchestrator/plumbing/outages.py
TRANSIENT: the database or Redis away, a row lock not had in time) raises out of the handler, and the reader hands
the same batch over again once it is back: nothing is acknowledged or dead-lettered meanwhile. A hello whose handling
fails otherwise (a bug) raises too, as a crash would: the batch is read again, counted, and an entry that keeps
failing is set aside alone after a few tries (streams.py `max_deliveries`); a job's task events whose handling fails
so are logged and counted by events.py, and the other jobs' applied. What a dead worker read and never acknowledged
is claimed by another reader after CLAIM_IDLE_MS.

Only a sealed hello or task event of the stream's own host is applied, after its size was bounded in Redis; anything
else is dead-lettered and counted. Hosts may not write the orchestrator's Celery queue (contracts/broker.py), and
nothing of theirs travels on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import redis

from contracts import broker
from contracts.protocol import AGENT_HELLO, EVENTS_GROUP, TASK_EVENT
from orchestrator.agents import events, reports
from orchestrator.identity import auth
from orchestrator.plumbing import counters, streams

ACCEPTED = (AGENT_HELLO, TASK_EVENT)
READ_COUNT = 500
# What an event may wait here at most while the streams are quiet, when Redis's keyspace notifications are off: with
# them on, an add wakes the readers (orchestrator/plumbing/doorbell.py).
IDLE_S = 0.05
CLAIM_IDLE_MS = 30_000  # what a dead worker had read and not applied is taken over by another after this long
# Readers per orchestrator worker, each a consumer of its own in the group: while one applies what it read (a burst of
# exits, each ending a job), the next reads what came meanwhile, as the worker's four pool threads applied the batches
# a relay put on the orchestrator queue (bench/scale.py: EXITED applied p95 0.18-0.51 s that way, 0.73-1.3 s with one
# reader per worker). As with several workers, entries of one host read apart may be applied out of order: an event
# overtaken by a newer one of its task is refused (events.apply_once), facts older than those stored are not stored
# (reports.record); within one read everything is applied in the order sent.
READERS = 4


def apply_entries(entries: list[streams.Entry]) -> list[tuple[streams.Entry, Exception]]:
    """The reader's handler: the entries applied in the order read (task events in batches); an outage raises, so the
    same entries are handed over again. Returns the entries that are not a sealed hello or task event of the stream's
    own host (dead-lettered)."""
    refused: list[tuple[streams.Entry, Exception]] = []
    batch: list[Any] = []

    def apply_batch() -> None:
        if batch:
            events.handle_task_events(list(batch))
            batch.clear()

    for entry in entries:
        try:
            name, envelope = streams.read_entry(entry)
            if name not in ACCEPTED:
                raise ValueError(f"{name[:100]!r} on an events stream")
        except Exception as exc:
            counters.incr(auth.MALFORMED)
            refused.append((entry, exc))
            continue
        if name == TASK_EVENT:
            batch.append(envelope)
            if len(batch) == events.MAX_BATCH:
                apply_batch()
        else:
            apply_batch()  # a host's hello after its earlier events, as it sent them
            reports.handle_report(envelope, hello=True)
    apply_batch()
    return refused


def reader(
    client: redis.Redis, consumer: str, hosts: Callable[[], Iterable[str]] | None = None
) -> streams.StreamReader:
    """A reader of every host's events stream, named `consumer` in the group (see the module's doc)."""
    return streams.StreamReader(
        client,
        kind=broker.EVENTS,
        group=EVENTS_GROUP,
        consumer=consumer,
        handler=apply_entries,
        hosts=hosts or streams.all_host_names,
        read_count=READ_COUNT,
        per_stream=READ_COUNT,
        idle_s=IDLE_S,
        wake_on_add=True,
        claim_idle_ms=CLAIM_IDLE_MS,
    )


def start_readers(client: redis.Redis, consumer: str, count: int = READERS) -> list[threading.Event]:
    """Run `count` readers named `consumer`/0, /1... in daemon threads of this process (once per name); set the
    returned events to stop them."""
    return [streams.start(reader(client, f"{consumer}/{n}")) for n in range(count)]
