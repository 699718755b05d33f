"""The ingest survives anything an entry holds: what it cannot store goes to the dead letters (bounded, counted,
acknowledged), the good entries of the same read are stored once, and only an unreachable database or Redis leaves
entries pending for a retry."""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.db import OperationalError

from contracts.protocol import HOST_SAMPLES, METRICS_GROUP, TASK_LOGS, TASK_METRICS
from orchestrator.identity import auth
from orchestrator.metrics import ingest
from orchestrator.metrics.stream import DEAD_LETTERED, DEAD_LETTERS
from orchestrator.models import MetricPoint, Task, TaskLogLine
from orchestrator.plumbing import counters
from orchestrator.plumbing.streams import DEAD_FIELD_BYTES
from tests import factories
from tests.orchestrator.metrics.conftest import consumer, envelope
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def metric(step: int, **values: float) -> dict[str, Any]:
    return {"kind": "metric", "ts": time.time(), "mono": 1.0, "step": step, "epoch": 0, "phase": "train",
            "metrics": values}  # fmt: skip


def add(client: redis.Redis, name: str, fields: dict[str, Any]) -> None:
    client.xadd(name, fields)


def report(name: str, payload: Any) -> dict[str, Any]:
    return {"name": name, "envelope": json.dumps(payload)}


def points(host: Any, token: str, task_id: int, *steps: int) -> dict[str, Any]:
    body = {"task_id": task_id, "attempt": 1, "events": [metric(step, loss=1.0 / step) for step in steps]}
    return report(TASK_METRICS, envelope(host, token, body))


def dead_letters(client: redis.Redis, name: str) -> list[dict[bytes, bytes]]:
    """The dead letters of the hosts' metric streams (the `stream` fixture empties them around each test)."""
    return [fields for _id, fields in client.xrange(DEAD_LETTERS)]


def test_a_hostile_mix_stores_every_good_point_once_and_sets_the_rest_aside(stream, running):
    client, name = stream
    _owner, host, token, job, task = running
    other, other_token = factories.host("node-1")
    dead_before, refused_before = counters.get(DEAD_LETTERED), counters.get(auth.REFUSED)
    future_id = task.pk + 1000
    deep = "[" * 100_000 + "]" * 100_000
    # Earlier tests' garbage (clients, apps) finalized now, at a shallow stack: a finalizer the collector happens to
    # run while the ingest is deep inside parsing `deep` hits the recursion limit, which Python ignores (so does the
    # ingest) but pytest reports as this test's failure (seen once another test with an outbox ran before this one).
    gc.collect()

    def mine(name: str, **body: Any) -> dict[str, Any]:
        """A report of `task` from its own host with its own token, with `body` as it comes."""
        return report(name, envelope(host, token, {"task_id": task.pk, "attempt": 1, **body}))

    huge_cut = json.dumps(envelope(host, token, {"task_id": task.pk, "attempt": 1, "events": ["x" * 10_000_000]}))

    def hostile() -> Iterator[dict[str, Any]]:
        """Made one by one as the loop adds them: an agent seals an entry as it sends it, and the ingest refuses an
        entry sealed before one added ahead of it as a replay (orchestrator/identity/stream_marks.py)."""
        # Unreadable: dead letters.
        yield {"name": TASK_METRICS, "envelope": deep}
        yield {"name": TASK_METRICS, "envelope": huge_cut[: len(huge_cut) // 2]}  # 5 MB, cut off: never read (bounds)
        yield {"name": b"\xff\xfe\x00", "envelope": b"\x80\x81\xfe"}
        yield {"name": TASK_METRICS, "envelope": b"\xc3\x28" * 1000}
        yield {"name": TASK_METRICS}
        # Read, then refused by the database: dead letters, found by storing the run report by report.
        yield mine(TASK_LOGS, lines=[[1, "stdout", "a\0b"]])
        yield mine(TASK_METRICS, events=[{"kind": "facts", "facts": {"k": "\0"}}])
        # Another host's message on this host's stream (real or forged): a host speaks only for itself. Dead letters.
        yield report(TASK_METRICS, envelope(other, token, {"task_id": task.pk, "attempt": 1, "events": [metric(90)]}))
        yield points(other, other_token, task.pk, 92)
        # Large, though a report: over the bound of an entry of its kind, never read.
        yield mine(TASK_METRICS, events=[metric(1000, loss=0.7), "x" * 10_000_000])
        # Read, but not to be trusted or not making sense: dropped and counted, as before.
        yield points(host, "tfa_forged", task.pk, 91)
        yield points(host, token, future_id, 93)  # no such task yet
        yield report(TASK_METRICS, 42)
        yield report(TASK_METRICS, None)
        yield report(TASK_METRICS, envelope(host, token, ["not", "a", "body"]))
        yield mine(TASK_METRICS, task_id="1", events=[])
        yield mine(TASK_METRICS, events={"a": 1})
        yield mine(TASK_METRICS, events=[{"kind": "metric", "step": "x", "metrics": []}, 5, None])
        yield mine(TASK_LOGS, lines=5)
        yield report(HOST_SAMPLES, envelope(host, token, {"samples": [[1, 2], "s", {"ts": "x"}, None]}))
        yield report("no_such_report", envelope(host, token, {}))

    unreadable, refused_by_db, other_hosts, too_big = 5, 2, 2, 1
    reader = consumer(client, name)
    step = 0
    for entry in hostile():  # a good entry after every bad one
        add(client, name, entry)
        step += 1
        add(client, name, points(host, token, task.pk, step))

    stop = threading.Event()
    thread = threading.Thread(target=reader.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: client.xlen(name) == 0, timeout=60, what="the stream to be drained")
        assert client.xpending(name, METRICS_GROUP)["pending"] == 0

        steps = list(MetricPoint.objects.filter(job=job).order_by("step").values_list("step", flat=True))
        assert steps == list(range(1, step + 1))  # every good point, once; none of the others
        assert not TaskLogLine.objects.exists()
        assert Task.objects.get(pk=task.pk).facts in ({}, None)
        letters = dead_letters(client, name)
        expected = unreadable + refused_by_db + other_hosts + too_big
        assert len(letters) == expected
        assert counters.get(DEAD_LETTERED) == dead_before + expected
        assert counters.get(auth.REFUSED) == refused_before + 3  # one forged, two not objects
        assert all(len(value) <= DEAD_FIELD_BYTES for letter in letters for value in letter.values())
        assert not any(token.encode() in value for letter in letters for value in letter.values())
        errors = sorted(letter[b"error"].decode().split(":")[0] for letter in letters)
        assert errors.count("RecursionError") == 1
        assert errors.count("UnicodeDecodeError") == 2
        assert errors.count("KeyError") == 1
        assert sum("over the bound for its kind" in error for error in errors) == 2
        assert sum("on the stream of host" in letter[b"error"].decode() for letter in letters) == 2
        assert all(letter[b"host"] == host.name.encode() for letter in letters)  # the stream's host, always known
        cut_size = len("name") + len(TASK_METRICS) + len("envelope") + len(huge_cut) // 2  # as Redis measures it
        cut = next(letter for letter in letters if letter[b"error"].startswith(f"{cut_size} bytes".encode()))
        assert b"envelope" not in cut  # never read, so nothing of it is kept

        # Still running; and the task that did not exist gets the points sent once it does.
        Task.objects.create(pk=future_id, job=job, attempt=1, type="worker", index=1, host=host, state="running")
        add(client, name, points(host, token, future_id, 94))
        add(client, name, points(host, token, task.pk, 95))
        wait_until(lambda: MetricPoint.objects.filter(step__in=(94, 95)).count() == 2, timeout=30, what="later points")
        assert thread.is_alive()
        assert not MetricPoint.objects.filter(step=93).exists()
    finally:
        stop.set()
        thread.join(10)


def test_only_the_reports_the_database_refuses_fail_in_a_run(stream, running):
    client, name = stream
    _owner, host, token, job, task = running
    add(client, name, points(host, token, task.pk, 1))
    add(client, name, report(TASK_LOGS, envelope(host, token, {"task_id": task.pk, "attempt": 1,
                                                               "lines": [[1, "stdout", "\0"]]})))  # fmt: skip
    add(client, name, report(TASK_LOGS, envelope(host, token, {"task_id": task.pk, "attempt": 1,
                                                               "lines": [[2, "stdout", "fine"]]})))  # fmt: skip
    add(client, name, points(host, token, task.pk, 2))

    assert consumer(client, name).drain_once() == 4

    assert list(MetricPoint.objects.filter(job=job).order_by("step").values_list("step", flat=True)) == [1, 2]
    assert list(TaskLogLine.objects.values_list("seq", "text")) == [(2, "fine")]
    [letter] = dead_letters(client, name)
    assert letter[b"name"] == TASK_LOGS.encode()
    assert client.xlen(name) == 0


def test_a_report_whose_handling_raises_is_set_aside_whatever_it_raises(stream, running, monkeypatch):
    client, name = stream
    _owner, host, token, job, task = running
    real = ingest.metric_rows

    def fragile(task_: Task, events: list[Any]) -> Any:
        if events and events[0].get("step") == 66:
            raise RecursionError("maximum recursion depth exceeded")
        return real(task_, events)

    monkeypatch.setattr(ingest, "metric_rows", fragile)
    add(client, name, points(host, token, task.pk, 65))
    add(client, name, points(host, token, task.pk, 66))
    add(client, name, points(host, token, task.pk, 67))

    consumer(client, name).drain_once()

    assert list(MetricPoint.objects.filter(job=job).order_by("step").values_list("step", flat=True)) == [65, 67]
    assert [letter[b"error"] for letter in dead_letters(client, name)] == [b"RecursionError: maximum recursion depth "
                                                                           b"exceeded"]  # fmt: skip


@pytest.mark.parametrize(
    "outage",
    [OperationalError("server closed the connection unexpectedly"), redis.ConnectionError("Connection refused")],
    ids=["database", "redis"],
)
def test_an_unreachable_database_or_redis_leaves_the_entries_pending_for_a_retry(stream, running, monkeypatch, outage):
    client, name = stream
    _owner, host, token, job, task = running
    real = ingest._write

    def down(batch: Any) -> None:
        raise outage

    monkeypatch.setattr(ingest, "_write", down)
    add(client, name, points(host, token, task.pk, 1))
    reader = consumer(client, name)
    with pytest.raises(type(outage)):
        reader.drain_once()
    assert client.xpending(name, METRICS_GROUP)["pending"] == 1
    assert not dead_letters(client, name)

    monkeypatch.setattr(ingest, "_write", real)
    assert reader.drain_once(backlog=True) == 1

    assert MetricPoint.objects.filter(job=job).count() == 1
    assert client.xpending(name, METRICS_GROUP)["pending"] == 0


class _PgError(Exception):
    def __init__(self, sqlstate: str | None) -> None:
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("sqlstate", "transient"),
    [(None, True), ("08006", True), ("40P01", True), ("57P01", True), ("53300", True), ("54000", False)],
)
def test_only_connection_and_resource_errors_count_as_transient(sqlstate, transient):
    error = OperationalError("x")
    error.__cause__ = _PgError(sqlstate)
    assert ingest.transient(error) is transient


def test_staff_see_the_latest_dead_letters_on_the_hosts_page(stream, client, django_user_model, monkeypatch):
    redis_client, name = stream
    add(redis_client, name, {"name": TASK_METRICS, "envelope": "[" * 100_000})
    consumer(redis_client, name).drain_once()
    client.force_login(django_user_model.objects.create_superuser("root", password="pw-root-123"))

    page = client.get("/admin/orchestrator/host/").content.decode()

    assert "RecursionError" in page
    assert TASK_METRICS in page
