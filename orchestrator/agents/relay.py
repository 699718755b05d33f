"""The hosts' hello and task events onto the orchestrator's own queue: every orchestrator worker reads every host's
EVENTS stream (orchestrator/plumbing/streams.py) and hands the entries to their Celery handlers (orchestrator/tasks.py),
which apply each at least once and exactly once (acknowledged after it ran, retried through outages, its nonce
remembered). Task events go in batches of up to `events.MAX_BATCH`, in the order read, so a gang's events are applied
under one lock of its job (orchestrator/agents/events.py); a hello goes alone.

Hosts may not write the orchestrator queue (contracts/broker.py): a host's credential could then call any
orchestrator task with any arguments. Only a sealed hello or task event of the stream's own host is handed on, after
its size was bounded in Redis; anything else is dead-lettered and counted. An entry is acknowledged once its message
is on the queue, so a worker that dies in between costs a duplicate, which the handler refuses as a replay.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import redis

from contracts import broker
from contracts.protocol import AGENT_HELLO, EVENTS_GROUP, ORCHESTRATOR_QUEUE, TASK_EVENT
from orchestrator.agents import events
from orchestrator.identity import auth
from orchestrator.plumbing import broker_sends, counters, streams
from orchestrator.plumbing.celery_app import app

RELAYED = (AGENT_HELLO, TASK_EVENT)
READ_COUNT = 500
IDLE_S = 0.05  # what an event may wait here at most while the streams are quiet
CLAIM_IDLE_MS = 30_000  # what a dead worker had read and not handed on is taken over by another after this long


def hand_on(entries: list[streams.Entry]) -> list[tuple[streams.Entry, Exception]]:
    """The reader's handler: the entries to their Celery handlers, in the order read (task events in batches); a
    broker error raises, so the entries are read again."""
    refused: list[tuple[streams.Entry, Exception]] = []
    batch: list[Any] = []
    with app.producer_or_acquire() as producer:

        def send_batch() -> None:
            if batch:
                broker_sends.send(events.TASK_EVENTS, [list(batch)], ORCHESTRATOR_QUEUE, producer)
                batch.clear()

        for entry in entries:
            try:
                name, envelope = streams.read_entry(entry)
                if name not in RELAYED:
                    raise ValueError(f"{name[:100]!r} on an events stream")
            except Exception as exc:
                counters.incr(auth.MALFORMED)
                refused.append((entry, exc))
                continue
            if name == TASK_EVENT:
                batch.append(envelope)
                if len(batch) == events.MAX_BATCH:
                    send_batch()
            else:
                send_batch()  # a host's hello after its earlier events, as it sent them
                broker_sends.send(name, [envelope], ORCHESTRATOR_QUEUE, producer)
        send_batch()
    return refused


def reader(
    client: redis.Redis, consumer: str, hosts: Callable[[], Iterable[str]] | None = None
) -> streams.StreamReader:
    return streams.StreamReader(
        client,
        kind=broker.EVENTS,
        group=EVENTS_GROUP,
        consumer=consumer,
        handler=hand_on,
        hosts=hosts or streams.all_host_names,
        read_count=READ_COUNT,
        per_stream=READ_COUNT,
        idle_s=IDLE_S,
        claim_idle_ms=CLAIM_IDLE_MS,
    )


def start_reader(client: redis.Redis, consumer: str) -> threading.Event:
    return streams.start(reader(client, consumer))
