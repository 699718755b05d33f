"""The one intake of what hosts send on their events stream (orchestrator/agents/intake.py), with real PostgreSQL and
Redis: a task event is applied straight from the stream and acknowledged only after its commit (a database outage
leaves it pending, never dead-lettered, and it is applied once when the database is back); a host's hello is applied
after the events it sent before it, task events in batches of up to events.MAX_BATCH, in the order sent; a replayed
entry is refused by its nonce; what is not a hello or task event is dead-lettered; what a dead reader took is claimed
by another."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from django.db import OperationalError

from contracts import broker
from contracts.host_reports import HostFacts, HostReport
from contracts.protocol import AGENT_HEARTBEAT, AGENT_HELLO, EVENTS_GROUP, TASK_EVENT, stream_entry
from contracts.task_messages import TaskEventKind
from orchestrator.agents import events, intake, reports
from orchestrator.identity import auth
from orchestrator.models import Task
from orchestrator.plumbing import counters, streams
from tests.orchestrator.agents.test_event_batches import Agents, fleet  # noqa: F401 - the fixture is used by name
from tests.support.wire import sealed


def _add(client: redis.Redis, host: str, name: str, envelope: Any) -> None:
    """What the host's agent does (worker_agent/outbox.py): an entry of its own events stream."""
    client.xadd(broker.stream(host, broker.EVENTS), stream_entry(name, envelope))


def _reader(client: redis.Redis, hosts: list[str], consumer: str = "test-intake") -> streams.StreamReader:
    made = intake.reader(client, consumer, hosts=lambda: hosts)
    made.ensure_groups()
    return made


@pytest.fixture
def client(redis_url: str, fleet) -> Any:  # noqa: F811
    made = redis.Redis.from_url(redis_url)
    yield made
    names = [host.name for host, _token in fleet[0]]
    made.delete(*(broker.stream(name, broker.EVENTS) for name in names), streams.dead_letter_stream(broker.EVENTS))


def _dead_letters(client: redis.Redis, hosts: list[str]) -> list[dict[bytes, bytes]]:
    """The events' dead letters of `hosts` (not another test's: test_transport's junk-0 leaves its own)."""
    letters = (fields for _id, fields in client.xrange(streams.dead_letter_stream(broker.EVENTS)))
    return [fields for fields in letters if fields.get(b"host", b"").decode() in hosts]


def _pending(client: redis.Redis, hosts: list[str]) -> int:
    return sum(client.xpending(broker.stream(h, broker.EVENTS), EVENTS_GROUP)["pending"] for h in hosts)


@pytest.mark.django_db(transaction=True)
def test_a_task_event_is_applied_from_the_stream_and_acknowledged_only_after_its_commit(fleet, client, monkeypatch):  # noqa: F811
    """The reader's own loop (StreamReader.run): a database outage while applying leaves the entries pending,
    handed over again after each backoff and never counted as a delivery; once the database is back they are applied
    once and acknowledged."""
    placed, [(_job, tasks), _other] = fleet
    names = [host.name for host, _token in placed]
    agents = Agents(placed)
    for task in tasks:
        _add(client, task.host.name, TASK_EVENT, agents.event(task, TaskEventKind.STARTED))
    one = _reader(client, names)
    one.max_deliveries = 2  # an outage that counted as deliveries would dead-letter them after two tries
    real = events.apply_event
    tries = {"failed": 0, "applied": 0}
    pending_meanwhile: list[int] = []
    stop = threading.Event()
    give_up = threading.Timer(60, stop.set)  # a reader that never gets there fails the asserts below, not the suite

    def database_away_for_a_while(task: Task, event: Any) -> None:
        if tries["failed"] < 4:
            tries["failed"] += 1
            pending_meanwhile.append(_pending(client, names))
            raise OperationalError("canceling statement due to lock timeout")
        real(task, event)
        tries["applied"] += 1
        if tries["applied"] == len(tasks):
            stop.set()  # the reader finishes this batch (acknowledges it) and stops

    monkeypatch.setattr(events, "apply_event", database_away_for_a_while)
    replayed = counters.get(auth.REPLAYED)

    give_up.start()
    try:
        one.run(stop)
    finally:
        give_up.cancel()

    assert tries == {"failed": 4, "applied": 2}
    assert pending_meanwhile == [2, 2, 2, 2]  # read, and not acknowledged while nothing was committed
    assert _pending(client, names) == 0 and not any(client.xlen(broker.stream(n, broker.EVENTS)) for n in names)
    assert not _dead_letters(client, names)  # an outage dead-letters nothing
    for task in tasks:
        task.refresh_from_db()
        assert task.event_seq > 0  # applied
    assert counters.get(auth.REPLAYED) == replayed  # once each: nothing was remembered, nothing refused


@pytest.mark.django_db
def test_a_hello_follows_the_events_sent_before_it_and_events_go_in_batches(fleet, client, monkeypatch):  # noqa: F811
    placed, [(_job, tasks), (_other, other_tasks)] = fleet
    (host, token), _second = placed
    agents = Agents(placed)
    mine = [t for t in tasks + other_tasks if t.host_id == host.pk]
    sent = [agents.event(t, TaskEventKind.STARTED) for t in mine] + [agents.event(mine[0], TaskEventKind.LISTENING)]
    facts = HostFacts(cpu_count=2, memory_total_mb=1024)
    hello = sealed(host.name, token, AGENT_HELLO, HostReport(facts=facts).to_body())
    for envelope in sent:
        _add(client, host.name, TASK_EVENT, envelope)
    _add(client, host.name, AGENT_HELLO, hello)
    _add(client, host.name, TASK_EVENT, agents.event(mine[1], TaskEventKind.LISTENING))
    monkeypatch.setattr(events, "MAX_BATCH", 2)
    calls: list[tuple[str, int]] = []
    real_events, real_report = events.handle_task_events, reports.handle_report

    def batch(payloads: list[Any]) -> int:
        calls.append(("events", len(payloads)))
        return real_events(payloads)

    def report(payload: Any, *, hello: bool) -> bool:
        calls.append(("hello" if hello else "heartbeat", 1))
        return real_report(payload, hello=hello)

    monkeypatch.setattr(events, "handle_task_events", batch)
    monkeypatch.setattr(reports, "handle_report", report)

    assert _reader(client, [host.name]).drain_once() == 5

    assert calls == [("events", 2), ("events", 1), ("hello", 1), ("events", 1)]
    host.refresh_from_db()
    assert host.last_heartbeat is not None  # the hello was applied
    assert all(Task.objects.get(pk=t.pk).event_seq > 0 for t in mine)
    assert _pending(client, [host.name]) == 0


@pytest.mark.django_db
def test_a_replayed_entry_is_refused_by_its_nonce_and_a_stranger_is_dead_lettered(fleet, client):  # noqa: F811
    placed, [(_job, tasks), _other] = fleet
    host, token = placed[0]
    event = Agents(placed).event(tasks[0], TaskEventKind.STARTED)
    one = _reader(client, [host.name])
    _add(client, host.name, TASK_EVENT, event)
    assert one.drain_once() == 1
    seq = Task.objects.get(pk=tasks[0].pk).event_seq
    replayed, malformed = counters.get(auth.REPLAYED), counters.get(auth.MALFORMED)

    _add(client, host.name, TASK_EVENT, event)  # the same entry again: a replay
    _add(client, host.name, AGENT_HEARTBEAT, sealed(host.name, token, AGENT_HEARTBEAT, {}))  # not on this stream
    assert one.drain_once() == 2

    assert counters.get(auth.REPLAYED) == replayed + 1
    assert Task.objects.get(pk=tasks[0].pk).event_seq == seq
    [letter] = _dead_letters(client, [host.name])
    assert b"on an events stream" in letter[b"error"]
    assert counters.get(auth.MALFORMED) == malformed + 1
    assert _pending(client, [host.name]) == 0


@pytest.mark.django_db
def test_what_a_dead_reader_took_is_claimed_and_applied_by_another(fleet, client):  # noqa: F811
    placed, [(_job, tasks), _other] = fleet
    host, _token = placed[0]
    _add(client, host.name, TASK_EVENT, Agents(placed).event(tasks[0], TaskEventKind.STARTED))
    dead = _reader(client, [host.name], consumer="dead")
    assert dead._read(backlog=False) is not None  # read, then its process died: never applied nor acknowledged
    assert _pending(client, [host.name]) == 1

    other = _reader(client, [host.name], consumer="alive")
    other.claim_idle_ms = 0  # (30 s in production: intake.CLAIM_IDLE_MS)
    other.take_over_abandoned()
    assert other.drain_once(backlog=True) == 1

    assert Task.objects.get(pk=tasks[0].pk).event_seq > 0
    assert _pending(client, [host.name]) == 0


def test_the_intake_reads_every_hosts_events_stream_in_its_own_group():
    made = intake.reader(redis.Redis(), "c", hosts=lambda: [])
    assert (made.kind, made.group, made.handler, made.claim_idle_ms) == (
        broker.EVENTS, EVENTS_GROUP, intake.apply_entries, intake.CLAIM_IDLE_MS,
    )  # fmt: skip
