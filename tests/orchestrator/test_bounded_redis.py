"""Redis memory that one host or task cannot grow without bound (contracts/publish_limits.py), against real Redis: a
read of the hosts' streams hands over at most its byte budget (plus one entry), the Redis the project starts refuses
writes past `maxmemory` and evicts nothing (make run, the suite, compose), an agent whose entry a full Redis refused
keeps it and adds it once there is room, and a reader still drains a full Redis, dead letters and all."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
import yaml

from contracts import broker
from contracts.protocol import TASK_METRICS
from contracts.publish_limits import READ_BYTES_BUDGET, REDIS_MAXMEMORY_BYTES, REDIS_MAXMEMORY_POLICY
from orchestrator.plumbing import streams
from tests.support.processes import wait_until

KIND = broker.METRICS
GROUP = "bounded-readers"
ENTRY_BYTES = 900_000  # under the entry bound (1 MiB): every entry is one a reader may be handed


@pytest.fixture
def host(redis_url: str) -> Iterator[str]:
    name = f"b-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    client.delete(broker.stream(name, KIND), streams.dead_letter_stream(KIND))


@pytest.fixture
def full_redis(redis_url: str) -> Iterator[redis.Redis]:
    """The test Redis with its `maxmemory` below what it holds: full, as a flood would leave it. Restored after."""
    client = redis.Redis.from_url(redis_url)
    before = client.config_get("maxmemory")["maxmemory"]
    client.set("bounded-redis-ballast", b"x" * 2_000_000)

    def fill() -> None:
        client.config_set("maxmemory", max(1, int(client.info("memory")["used_memory"]) - 1_000_000))

    client.fill = fill  # type: ignore[attr-defined]
    yield client
    client.config_set("maxmemory", before)
    client.delete("bounded-redis-ballast")


def reader(client: redis.Redis, host: str, seen: list[bytes]) -> streams.StreamReader:
    def handler(entries: list[streams.Entry]) -> list[tuple[streams.Entry, Exception]]:
        seen.extend(entry.id for entry in entries)
        return []

    made = streams.StreamReader(client, kind=KIND, group=GROUP, consumer="c", handler=handler, hosts=lambda: [host])
    made.ensure_groups()
    return made


def test_one_read_hands_over_at_most_its_byte_budget_plus_one_entry(redis_url, host):
    client = redis.Redis.from_url(redis_url)
    seen: list[bytes] = []
    one = reader(client, host, seen)
    entries = 3 * READ_BYTES_BUDGET // ENTRY_BYTES  # three budgets' worth, far under the 500 entries a read may take
    for _ in range(entries):
        client.xadd(broker.stream(host, KIND), {"name": TASK_METRICS, "envelope": b"x" * ENTRY_BYTES})

    first = one.drain_once()

    most = READ_BYTES_BUDGET // ENTRY_BYTES + 1
    assert 1 <= first <= most, f"one read took {first} entries of {ENTRY_BYTES:,} bytes (budget {READ_BYTES_BUDGET:,})"
    while one.drain_once():  # the rest follow in later reads: nothing is left behind
        pass
    assert len(seen) == entries
    assert client.xlen(broker.stream(host, KIND)) == 0


def test_a_reader_starting_again_reads_its_pending_entries_within_the_byte_budget_too(redis_url, host):
    client = redis.Redis.from_url(redis_url)
    seen: list[bytes] = []
    one = reader(client, host, seen)
    entries = 3 * READ_BYTES_BUDGET // ENTRY_BYTES
    for _ in range(entries):
        client.xadd(broker.stream(host, KIND), {"name": TASK_METRICS, "envelope": b"x" * ENTRY_BYTES})
    client.xreadgroup(GROUP, "c", {broker.stream(host, KIND): ">"}, count=entries)  # read, then the reader died

    first = one.drain_once(backlog=True)

    assert 2 <= first <= READ_BYTES_BUDGET // ENTRY_BYTES + 1, first
    while one.drain_once(backlog=True):
        pass
    assert len(seen) == entries and client.xlen(broker.stream(host, KIND)) == 0


def test_the_redis_the_project_starts_refuses_writes_past_its_bound_and_evicts_nothing(redis_url):
    # The suite's Redis is scripts/local_services.py EmbeddedRedis, as make run's and the benches' are.
    client = redis.Redis.from_url(redis_url)
    assert int(client.config_get("maxmemory")["maxmemory"]) == REDIS_MAXMEMORY_BYTES
    assert client.config_get("maxmemory-policy")["maxmemory-policy"] == REDIS_MAXMEMORY_POLICY == "noeviction"
    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text())
    command = " ".join(compose["services"]["redis"]["command"])
    assert f"--maxmemory {REDIS_MAXMEMORY_BYTES} --maxmemory-policy {REDIS_MAXMEMORY_POLICY}" in command


def test_a_full_redis_refuses_an_agents_entry_which_its_outbox_keeps_and_adds_once_there_is_room(
    redis_url, full_redis, host
):
    from worker_agent.outbox import Outbox

    app = SimpleNamespace(conf=SimpleNamespace(broker_url=redis_url))  # the outbox's own XADD path, pipelined
    outbox = Outbox(app, host, b"k" * 32, max_backoff_s=0.05)  # type: ignore[arg-type]
    stream = broker.stream(host, KIND)
    try:
        full_redis.fill()  # type: ignore[attr-defined]
        outbox.send(TASK_METRICS, {"task_id": 1, "attempt": 1, "events": []}, queue=KIND)
        wait_until(lambda: outbox.failures >= 2, timeout=10, what="the full Redis to refuse the entry, twice")
        assert full_redis.xlen(stream) == 0 and outbox.pending() == 1  # refused, not lost
        full_redis.delete("bounded-redis-ballast")  # what a draining ingest does: room again
        full_redis.config_set("maxmemory", REDIS_MAXMEMORY_BYTES)
        assert outbox.flush(timeout=10)
        assert [fields[b"name"] for _id, fields in full_redis.xrange(stream)] == [TASK_METRICS.encode()]
    finally:
        outbox.stop()


def test_a_reader_drains_a_full_redis_even_when_it_has_dead_letters_to_write(full_redis, host):
    seen: list[bytes] = []
    one = reader(full_redis, host, seen)
    stream = broker.stream(host, KIND)
    good = full_redis.xadd(stream, {"name": TASK_METRICS, "envelope": b"{}"})
    full_redis.xadd(stream, {"name": TASK_METRICS, "envelope": b"x" * 1_100_000})  # over its bound: a dead letter
    full_redis.fill()  # type: ignore[attr-defined]
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        full_redis.xadd(stream, {"name": TASK_METRICS, "envelope": b"{}"})  # full indeed

    assert one.drain_once() == 2  # no OOM error: acknowledging and deleting is what frees a full Redis

    assert seen == [good]
    assert full_redis.xlen(stream) == 0
    assert one.dead == 1
