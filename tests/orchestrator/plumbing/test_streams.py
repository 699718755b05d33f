"""The one reader of the hosts' streams (orchestrator/plumbing/streams.py), against real Redis: bounded before parsed
(an entry over its bound never reaches the reader's process), an entry that keeps failing is dead-lettered after a few
tries (no crash loop), every host's stream is read and a new host's is found, and a stream entry is acknowledged only
after its handler returned."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.db import OperationalError

from contracts import broker
from contracts.protocol import MAX_ENTRY_BYTES, TASK_ARTIFACT, TASK_METRICS
from orchestrator.plumbing import counters, streams
from tests.support.processes import wait_until

KIND = broker.METRICS
GROUP = "test-readers"


@pytest.fixture
def hosts(redis_url: str) -> Iterator[list[str]]:
    """Two hosts of this test's own (no database needed: the reader is given its host list)."""
    names = [f"s-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    yield names
    client = redis.Redis.from_url(redis_url)
    client.delete(*(broker.stream(name, KIND) for name in names), streams.dead_letter_stream(KIND))


class Recorder:
    """A handler that keeps what it was handed; raises for entries whose `name` is in `fail`."""

    def __init__(self, fail: tuple[bytes, ...] = ()) -> None:
        self.seen: list[tuple[str, bytes]] = []
        self.fail = fail

    def __call__(self, entries: list[streams.Entry]) -> list[tuple[streams.Entry, Exception]]:
        for entry in entries:
            if entry.fields.get(b"name") in self.fail:
                raise RuntimeError("the handler dies on this one")  # as a process killed by it would, every time
        self.seen += [(entry.host, entry.fields[b"name"]) for entry in entries]
        return []


def reader(client: redis.Redis, names: list[str], handler: streams.Handler, **options: object) -> streams.StreamReader:
    made = streams.StreamReader(client, kind=KIND, group=GROUP, consumer="c", handler=handler, hosts=lambda: names,
                                **options)  # type: ignore[arg-type]  # fmt: skip
    made.ensure_groups()
    return made


def test_every_hosts_stream_is_read_and_each_entry_knows_its_host(redis_url, hosts):
    client = redis.Redis.from_url(redis_url)
    recorder = Recorder()
    one = reader(client, hosts, recorder)
    for number, host in enumerate(hosts):
        client.xadd(broker.stream(host, KIND), {"name": f"m{number}"})

    assert one.drain_once() == 2

    assert sorted(recorder.seen) == sorted([(hosts[0], b"m0"), (hosts[1], b"m1")])
    assert not any(client.xlen(broker.stream(host, KIND)) for host in hosts)  # acknowledged and deleted


def test_an_entry_over_its_bound_is_dead_lettered_unread_and_the_rest_go_on(redis_url, hosts):
    client = redis.Redis.from_url(redis_url)
    recorder = Recorder()
    one = reader(client, hosts, recorder)
    stream = broker.stream(hosts[0], KIND)
    dead = counters.get(streams.dead_letter_counter(KIND))
    client.xadd(stream, {"name": "before"})
    client.xadd(stream, {"name": TASK_METRICS, "envelope": b"x" * (MAX_ENTRY_BYTES + 1)})
    client.xadd(stream, {"name": TASK_ARTIFACT, "envelope": b"x" * (MAX_ENTRY_BYTES + 1)})  # an artifact may be bigger
    client.xadd(stream, {"name": "after"})

    assert one.drain_once() == 4

    assert recorder.seen == [(hosts[0], b"before"), (hosts[0], TASK_ARTIFACT.encode()), (hosts[0], b"after")]
    [letter] = [fields for _id, fields in client.xrange(streams.dead_letter_stream(KIND))]
    assert letter[b"host"] == hosts[0].encode()
    assert b"over the bound" in letter[b"error"]
    assert b"envelope" not in letter  # never read: nothing of it kept
    assert counters.get(streams.dead_letter_counter(KIND)) == dead + 1


def test_an_entry_that_keeps_killing_its_reader_is_set_aside_alone_after_a_few_tries(redis_url, hosts):
    """What a reader restarted after each crash does: its pending entries first. Entries delivered twice already are
    read one at a time, so the one that kills it is dead-lettered after `max_deliveries` and the one read with it is
    handled."""
    client = redis.Redis.from_url(redis_url)
    recorder = Recorder(fail=(b"poison",))
    stream = broker.stream(hosts[0], KIND)
    client.xadd(stream, {"name": "poison"})
    client.xadd(stream, {"name": "good"})

    crashes, backlog = 0, False
    while True:
        one = reader(client, hosts, recorder, max_deliveries=3)  # a new process each time
        try:
            if one.drain_once(backlog=backlog) == 0 and backlog:
                break
        except RuntimeError:
            crashes += 1
            assert crashes < 10, "the poison entry was never set aside"
        backlog = True

    assert crashes == 3
    assert recorder.seen == [(hosts[0], b"good")]
    [letter] = [fields for _id, fields in client.xrange(streams.dead_letter_stream(KIND))]
    assert b"delivered 3 times" in letter[b"error"]
    assert client.xpending(stream, GROUP)["pending"] == 0


def test_an_outage_is_waited_out_with_the_same_batch_and_never_dead_letters(redis_url, hosts):
    client = redis.Redis.from_url(redis_url)
    outage = [True]
    handled: list[bytes] = []

    def flaky(entries: list[streams.Entry]) -> list[tuple[streams.Entry, Exception]]:
        if outage[0]:
            raise redis.ConnectionError("the database or Redis is away")
        handled.extend(entry.fields[b"name"] for entry in entries)
        return []

    stream = broker.stream(hosts[0], KIND)
    client.xadd(stream, {"name": "kept"})
    one = reader(client, hosts, flaky, max_deliveries=2)
    for _ in range(5):  # far more tries than max_deliveries
        with pytest.raises(redis.ConnectionError):
            one.drain_once()
    assert client.xpending(stream, GROUP)["pending"] == 1  # nothing acknowledged meanwhile

    outage[0] = False
    assert one.drain_once(backlog=True) == 1

    assert handled == [b"kept"]
    assert not client.xrange(streams.dead_letter_stream(KIND))
    assert client.xpending(stream, GROUP)["pending"] == 0


def running(one: streams.StreamReader) -> tuple[threading.Event, threading.Thread]:
    """The reader's own loop (what the ingest and the orchestrator run), in a thread."""
    stop = threading.Event()
    thread = threading.Thread(target=one.run, args=(stop,), daemon=True)
    thread.start()
    return stop, thread


def test_a_reader_started_while_the_database_is_away_reads_what_it_had_left_pending(redis_url, hosts):
    """The chaos soak's lost point: the ingest read an entry, the database went away before it was stored, and the
    ingest was killed and started again while the database was still away, so it could not read the host list. Its
    backlog read found no streams and ended; it read only new entries after that, and the one it had read before its
    restart stayed pending, never stored."""
    client = redis.Redis.from_url(redis_url)
    stream = broker.stream(hosts[0], KIND)
    client.xadd(stream, {"name": "left pending"})

    def database_away(entries: list[streams.Entry]) -> list[tuple[streams.Entry, Exception]]:
        raise OperationalError("the database went away")

    with pytest.raises(OperationalError):
        reader(client, hosts, database_away).drain_once()  # the process killed after this
    assert client.xpending(stream, GROUP)["pending"] == 1

    database_up = threading.Event()
    asked = []

    def host_list() -> list[str]:
        asked.append(time.monotonic())
        if not database_up.is_set():
            raise OperationalError("connection refused")
        return hosts

    recorder = Recorder()
    again = streams.StreamReader(client, kind=KIND, group=GROUP, consumer="c", handler=recorder, hosts=host_list)
    stop, thread = running(again)
    try:
        wait_until(lambda: len(asked) >= 3, 10, what="the restarted reader to ask for the host list three times")
        client.xadd(stream, {"name": "new"})
        database_up.set()
        wait_until(lambda: len(recorder.seen) >= 2, 10, what=f"both entries handled (handled: {recorder.seen})")
    finally:
        stop.set()
        thread.join(10)
    assert recorder.seen == [(hosts[0], b"left pending"), (hosts[0], b"new")]
    assert client.xpending(stream, GROUP)["pending"] == 0


def test_what_a_dead_reader_left_is_claimed_and_read_by_a_running_one(redis_url, hosts):
    """A reader that died for good (its partition moved, its worker gone) leaves entries pending under its name: a
    running reader claims them after `claim_idle_ms` and reads them then, not only at its own next restart."""
    client = redis.Redis.from_url(redis_url)
    stream = broker.stream(hosts[0], KIND)
    client.xadd(stream, {"name": "abandoned"})
    dead = streams.StreamReader(client, kind=KIND, group=GROUP, consumer="dead", handler=Recorder(fail=(b"abandoned",)),
                                hosts=lambda: hosts)  # fmt: skip
    dead.ensure_groups()
    with pytest.raises(RuntimeError):
        dead.drain_once()
    assert client.xpending(stream, GROUP)["pending"] == 1

    recorder = Recorder()
    live = streams.StreamReader(client, kind=KIND, group=GROUP, consumer="live", handler=recorder, hosts=lambda: hosts,
                                claim_idle_ms=500, claim_every_s=0.1)  # fmt: skip
    stop, thread = running(live)  # its start's backlog read finds nothing of its own; the claim comes later
    try:
        wait_until(lambda: recorder.seen, 10, what="the abandoned entry handled by the running reader")
    finally:
        stop.set()
        thread.join(10)
    assert recorder.seen == [(hosts[0], b"abandoned")]
    assert client.xpending(stream, GROUP)["pending"] == 0


def test_a_new_host_and_a_lost_group_are_found_without_a_restart(redis_url, hosts):
    client = redis.Redis.from_url(redis_url)
    recorder = Recorder()
    known = [hosts[0]]
    one = reader(client, known, recorder)
    known.append(hosts[1])  # registered meanwhile
    one.forget_hosts()
    client.xadd(broker.stream(hosts[1], KIND), {"name": "new"})

    while one.drain_once() == 0 and not recorder.seen:
        pass  # the first read makes the group (from the stream's start), the next reads the entry

    assert recorder.seen == [(hosts[1], b"new")]
    client.delete(broker.stream(hosts[1], KIND))  # what Redis restarted without persistence leaves
    client.xadd(broker.stream(hosts[1], KIND), {"name": "again"})
    assert one.drain_once() == 0  # the group is made again
    assert one.drain_once() == 1
    assert recorder.seen[-1] == (hosts[1], b"again")


def test_reads_spread_over_many_streams_keep_their_bounds_and_miss_nothing(redis_url, monkeypatch):
    """New entries are read from many streams per command (streams.MANY_STREAMS; a few here, so one read takes
    several commands): a read hands over at most `read_count` entries and at most `per_stream` of one stream, each
    stream's in order, and reads go on until every entry was handed over once."""
    monkeypatch.setattr(streams, "MANY_STREAMS", 4)
    client = redis.Redis.from_url(redis_url)
    names = [f"s-{uuid.uuid4().hex[:8]}" for _ in range(11)]
    counts = [0, 1, 12, 0, 3, 1, 0, 0, 7, 1, 2]  # most streams have little or nothing; one has more than a read takes
    try:
        recorder = Recorder()
        many = reader(client, names, recorder, read_count=9, per_stream=5)
        for host, count in zip(names, counts, strict=True):
            for n in range(count):
                client.xadd(broker.stream(host, KIND), {"name": f"m{n}"})
        reads = []
        while many.drain_once():
            reads.append(recorder.seen)
            recorder.seen = []
        assert reads and all(len(batch) <= 9 for batch in reads)
        assert all(sum(1 for host, _ in batch if host == name) <= 5 for batch in reads for name in names)
        every = [entry for batch in reads for entry in batch]
        for host, count in zip(names, counts, strict=True):
            assert [name for h, name in every if h == host] == [f"m{n}".encode() for n in range(count)]
        assert len(every) == sum(counts)
    finally:
        client.delete(*(broker.stream(name, KIND) for name in names))
