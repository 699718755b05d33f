"""Bounded before parsed, in the real ingest process: a 64 MiB and a 100 MB entry a host added to its metrics stream
are dead-lettered without ever reaching the ingest (it stays under 200 MB of memory), and the good points around them
are stored."""

from __future__ import annotations

import json
import sys
import threading
import time

import psutil
import pytest

from contracts.protocol import TASK_ARTIFACT, TASK_METRICS
from orchestrator.metrics.stream import DEAD_LETTERED, DEAD_LETTERS
from orchestrator.models import MetricPoint
from orchestrator.plumbing import counters
from tests.orchestrator.metrics.conftest import envelope
from tests.support.processes import ManagedProcess, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

MB = 1024 * 1024


def point(host, token, task, step: int) -> dict[str, str]:  # type: ignore[no-untyped-def]
    body = {"task_id": task.pk, "attempt": 1, "events": [{"kind": "metric", "ts": time.time(), "mono": 1.0,
                                                          "step": step, "epoch": 0, "phase": "train",
                                                          "metrics": {"loss": 1.0 / step}}]}  # fmt: skip
    return {"name": TASK_METRICS, "envelope": json.dumps(envelope(host, token, body))}


def test_huge_entries_are_dead_lettered_unread_and_the_ingest_stays_small(stream, running, service_env):
    client, name = stream
    _owner, host, token, job, task = running
    dead = counters.get(DEAD_LETTERED)
    ingest = ManagedProcess("ingest", [sys.executable, "manage.py", "ingest_metrics"], service_env)
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        process = psutil.Process(ingest.pid)
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], process.memory_info().rss)
            except psutil.NoSuchProcess:
                return
            stop.wait(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        ingest.wait_for_line(r"metrics ingest \S+ ready", timeout=60)
        watcher.start()
        client.xadd(name, point(host, token, task, 1))
        client.xadd(name, {"name": TASK_METRICS, "envelope": b"x" * (64 * MB)})
        client.xadd(name, point(host, token, task, 2))
        # Named an artifact, whose kind may weigh more than a metric report, and still over that bound.
        client.xadd(name, {"name": TASK_ARTIFACT, "envelope": b"y" * (100 * 1000 * 1000)})
        client.xadd(name, point(host, token, task, 3))

        wait_until(lambda: MetricPoint.objects.filter(job=job).count() == 3, 60, what="the three good points stored")
        wait_until(lambda: client.xlen(name) == 0, 30, what="the stream drained")
        assert ingest.proc.poll() is None, ingest.output()[-3000:]
    finally:
        stop.set()
        ingest.stop()

    assert peak[0] < 200 * MB, f"the ingest grew to {peak[0] / MB:.0f} MB"
    letters = [fields for _id, fields in client.xrange(DEAD_LETTERS)]
    assert len(letters) == 2
    assert all(b"over the bound for its kind" in letter[b"error"] for letter in letters)
    assert all(letter[b"host"] == host.name.encode() for letter in letters)
    assert counters.get(DEAD_LETTERED) == dead + 2
    print(f"bounded ingest: peak RSS {peak[0] / MB:.0f} MB while 164 MB of entries were set aside")
