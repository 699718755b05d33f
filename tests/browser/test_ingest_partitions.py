"""A page resumes across a change of the ingest's partitions with no gap and no duplicate: real sealed bundles on the
hosts' streams, stored by the real ingest readers (first one partition reading both hosts, then two, one host each,
while the page is away), a real Chromium page that reconnects by itself from its cursor (contracts/protocol.py
POINT_SEQ)."""

from __future__ import annotations

import time
import zlib
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model

from contracts import broker
from contracts.bundles import HOST_REPORTS
from contracts.protocol import TASK_METRICS, ingest_partition, stream_entry
from orchestrator.metrics.stream import MetricsConsumer
from orchestrator.models import Job, MetricPoint, Task
from tests import factories
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_live import sign_in, state_of, wait_live
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db(transaction=True)


def two_hosts_apart() -> list[str]:
    """Two host names that two partitions give to different readers."""
    names = [f"part-{n}" for n in range(20)]
    first = names[0]
    second = next(n for n in names if ingest_partition(n, 2) != ingest_partition(first, 2))
    assert zlib.crc32(first.encode()) % 2 != zlib.crc32(second.encode()) % 2
    return [first, second]


def make_scene(names: list[str]) -> dict[str, Any]:
    alice = get_user_model().objects.create_user("alice", password="pw-alice-123")
    hosts = [factories.host(name, port_min=24000 + 100 * i) for i, name in enumerate(names)]
    job = Job.objects.create(owner=alice, cluster=hosts[0][0].cluster, name="spread", strategy="multi_worker_mirrored",
                             program_kind="script", workers=2, attempt=1, state="running")  # fmt: skip
    tasks = [
        Task.objects.create(job=job, attempt=1, type="worker", index=i, host=host, state="running")
        for i, (host, _token) in enumerate(hosts)
    ]
    return {"job": job.pk, "hosts": [(h.name, token, t.pk) for (h, token), t in zip(hosts, tasks, strict=True)]}


def report(client: redis.Redis, hosts: list[tuple[str, str, int]], steps: range) -> None:
    """Each host's agent sends its task's points for `steps` as one sealed bundle on its metrics stream."""
    for name, token, task_id in hosts:
        events = [{"kind": "metric", "ts": time.time(), "step": s, "phase": "train", "metrics": {"loss": 1.0 / s}}
                  for s in steps]  # fmt: skip
        bundle = {"reports": [[TASK_METRICS, {"task_id": task_id, "attempt": 1, "events": events[:5]}],
                              [TASK_METRICS, {"task_id": task_id, "attempt": 1, "events": events[5:]}]]}  # fmt: skip
        entry = stream_entry(HOST_REPORTS, sealed(name, token, HOST_REPORTS, bundle))
        client.xadd(broker.stream(name, broker.METRICS), entry)


def drain(readers: list[MetricsConsumer]) -> int:
    stored = 0
    for reader in readers:
        reader.reader.forget_hosts()
        reader.reader.ensure_groups()
        while reader.drain_once():
            pass
        stored += reader.stored.points
    return stored


def numbers(job_id: int) -> list[int]:
    return list(MetricPoint.objects.filter(job_id=job_id).order_by("seq").values_list("seq", flat=True))


def test_a_page_resumes_across_a_partition_change_with_no_gap_and_no_duplicate(
    orm: Orm, web: WebServer, browser: Any
) -> None:
    names = two_hosts_apart()
    scene = orm(make_scene, names)
    job, hosts = scene["job"], scene["hosts"]
    client = redis.Redis.from_url(settings.REDIS_URL)
    for name in names:
        client.delete(broker.stream(name, broker.METRICS))
    one = [MetricsConsumer(client, consumer="ingest-0", hosts=lambda: names, partition=0, partitions=1)]
    two = [
        MetricsConsumer(client, consumer=f"ingest-{p}", hosts=lambda: names, partition=p, partitions=2) for p in (0, 1)
    ]

    report(client, hosts, range(1, 11))
    assert orm(drain, one) == 20
    page = browser.new_page()
    sign_in(page, web, "alice", "pw-alice-123", f"/jobs/{job}/")
    wait_live(page, "tfdashLive.status === 'live' && tfdashLive.pointsReceived === 20")
    report(client, hosts, range(11, 21))  # live, through the one partition
    orm(drain, one)
    wait_live(page, "tfdashLive.pointsReceived === 40")

    # The page loses its server; meanwhile the ingest runs as two partitions, one host each.
    web.kill()
    wait_live(page, "tfdashLive.status === 'reconnecting'")
    report(client, hosts, range(21, 41))
    assert orm(drain, two) == 40
    assert [reader.stored.points for reader in two] == [20, 20]
    web.start()
    wait_live(page, "tfdashLive.status === 'live' && tfdashLive.pointsReceived === 80")
    report(client, hosts, range(41, 51))  # live again, through both partitions
    orm(drain, two)
    wait_live(page, "tfdashLive.pointsReceived === 100")

    stored = orm(numbers, job)
    final = state_of(page)
    assert len(stored) == 100 and stored == sorted(set(stored))
    assert final["points"] == 100 and final["duplicates"] == 0 and final["reconnects"] == 1
    assert sorted(page.evaluate("tfdashLive.pointIds()")) == stored
    assert final["cursor"] == stored[-1]
