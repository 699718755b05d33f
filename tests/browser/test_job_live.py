"""The job page's live client in a real browser: history, then live points; a page whose server dies reconnects by
itself and ends with every point exactly once; a user who may not see the job gets "not allowed" and no retry loop."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from orchestrator.metrics import live
from orchestrator.models import Job, MetricPoint, Task
from tests import factories
from tests.browser.conftest import Orm, WebServer

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_MS = 15_000
# What Chromium itself logs when a connection fails (the server is down or refuses): no script error.
NETWORK_NOISE = re.compile(
    r"WebSocket connection to .* failed"
    r"|Failed to load resource: net::ERR_CONNECTION_REFUSED"
)


def make_scene() -> dict[str, Any]:
    users = get_user_model().objects
    alice = users.create_user("alice", password="pw-alice-123")
    users.create_user("bob", password="pw-bob-123")
    gpu_host, _ = factories.host("gpu-node")
    cpu_host, _ = factories.host("cpu-node", port_min=24100)
    job = Job.objects.create(
        owner=alice,
        cluster=gpu_host.cluster,
        name="mnist",
        strategy="multi_worker_mirrored",
        program_kind="script",
        workers=2,
        attempt=1,
        state="running",
    )
    tasks = [
        Task.objects.create(job=job, attempt=1, type="worker", index=i, host=h, state="running")
        for i, h in enumerate((gpu_host, cpu_host))
    ]
    return {"job": job.pk, "tasks": [t.pk for t in tasks]}


def store(job_id: int, task_ids: list[int], steps: range, names: tuple[str, ...] = ("loss",)) -> list[list[Any]]:
    """Train points for every task, metric and step, as the ingest stores them; returned as frame rows, in order."""
    rows = MetricPoint.objects.bulk_create(
        MetricPoint(
            job_id=job_id,
            task_id=t,
            phase="train",
            name=n,
            step=s,
            epoch=1 + s // 500,
            value=value(n, i, s),
            ts=1.7e9 + s,
        )
        for s in steps
        for i, t in enumerate(task_ids)
        for n in names
    )
    return sorted([[r.seq, r.task_id, r.phase, r.name, r.step, r.epoch, r.value, r.ts] for r in rows])


def value(name: str, task_index: int, step: int) -> float:
    if name == "examples_per_s":
        return 1200.0 - 150 * task_index + 40 * math.sin(step / 40)
    return (1.0 + 0.25 * task_index) / math.sqrt(step) + 0.02 * math.sin(step / 15)


def store_epochs(job_id: int, task_ids: list[int], epochs: range) -> int:
    rows = MetricPoint.objects.bulk_create(
        MetricPoint(job_id=job_id, task_id=t, phase="epoch_end", name=n, step=e * 500, epoch=e, value=v, ts=1.7e9 + e)
        for e in epochs
        for t in task_ids
        for n, v in (("val_loss", 1 / e), ("val_accuracy", 1 - 1 / (e + 1)))
    )
    return len(rows)


def stored_ids(job_id: int) -> list[int]:
    return list(MetricPoint.objects.filter(job_id=job_id).order_by("seq").values_list("seq", flat=True))


def publish(job_id: int, points: list[list[Any]]) -> None:
    live.publish(job_id, {"type": "metrics", "points": points, "cursor": max(p[0] for p in points)})


def host_sample(host: str, ts: float, gpus: int = 0) -> dict[str, Any]:
    gpu = {"utilization_percent": 90.0 + ts % 7, "memory_used_mb": 30000, "memory_total_mb": 81920}
    return {
        "host": host,
        "ts": ts,
        "cpu_percent": 40.0 + ts % 30,
        "memory_used_mb": 9000,
        "memory_total_mb": 64000,
        "gpus": [{"index": i, **gpu} for i in range(gpus)],
    }


def sign_in(page: Any, web: WebServer, username: str, password: str, next_path: str) -> None:
    page.goto(f"{web.url}/accounts/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("form.login button[type=submit]")
    page.wait_for_load_state("domcontentloaded")


def wait_live(page: Any, condition: str) -> None:
    page.wait_for_function(f"() => window.tfdashLive && ({condition})", timeout=WAIT_MS, polling=50)


def state_of(page: Any) -> dict[str, Any]:
    return page.evaluate(
        "() => ({status: tfdashLive.status, cursor: tfdashLive.cursor, points: tfdashLive.pointsReceived,"
        " duplicates: tfdashLive.duplicatesReceived, reconnects: tfdashLive.reconnects,"
        " redraws: tfdashLive.redraws, downsampled: tfdashLive.downsampled})"
    )


def test_a_page_that_loses_its_socket_reconnects_by_itself_and_gets_every_point_once(
    orm: Orm, web: WebServer, browser: Any, artifacts_dir: Path
) -> None:
    scene = orm(make_scene)
    job, tasks = scene["job"], scene["tasks"]
    # History at the most the server sends undownsampled: 2,000 points per series, two tasks, two train metrics.
    orm(store, job, tasks, range(1, 2001), ("loss", "examples_per_s"))
    history = 8000 + orm(store_epochs, job, tasks, range(1, 5))

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
    sign_in(page, web, "alice", "pw-alice-123", f"/jobs/{job}/")
    assert page.url == f"{web.url}/jobs/{job}/"

    wait_live(page, f"tfdashLive.status === 'live' && tfdashLive.pointsReceived === {history}")
    assert page.evaluate("tfdashLive.seriesPointCount('loss')") == 4000
    assert page.evaluate("tfdashLive.seriesPointCount('examples_per_s')") == 4000
    wait_live(page, "['loss', 'examples', 'val_loss', 'val_accuracy'].every((c) => tfdashLive.chartPoints(c) > 0)")
    assert page.evaluate("tfdashLive.chartPoints('loss')") == 2000  # both tasks on one step axis
    assert state_of(page)["redraws"] <= 5, "history must be drawn in a few batches, not point by point"

    # Live: points, host load and facts, as the ingest publishes them.
    publish(job, orm(store, job, tasks, range(2001, 2011)))
    now = time.time()
    live.publish(job, {"type": "hosts", "samples": [host_sample("gpu-node", now - 2 + i, gpus=1) for i in range(3)]})
    live.publish(job, {"type": "hosts", "samples": [host_sample("cpu-node", now - 2.3 + i) for i in range(3)]})
    live.publish(job, {"type": "facts", "task": tasks[0], "facts": {"replicas_in_sync": 2, "<b>html</b>": "<i>x</i>"}})
    wait_live(page, f"tfdashLive.pointsReceived === {history + 20}")
    wait_live(page, "['cpu', 'gpu_util', 'gpu_mem'].every((c) => tfdashLive.chartPoints(c) > 0)")
    facts = page.locator("#task-facts")
    facts.wait_for(state="visible", timeout=WAIT_MS)
    assert "<i>x</i>" in facts.inner_text()  # shown as text, never parsed as markup
    assert facts.locator("i").count() == 0
    assert not errors, errors
    page.screenshot(path=str(artifacts_dir / "job-page-1280.png"), full_page=True)

    # The server dies for real; points keep coming while nobody listens.
    seen_before = state_of(page)["cursor"]
    web.kill()
    wait_live(page, "tfdashLive.status === 'reconnecting'")
    publish(job, orm(store, job, tasks, range(2011, 2031)))
    web.start()

    db_ids = orm(stored_ids, job)
    wait_live(page, f"tfdashLive.status === 'live' && tfdashLive.pointsReceived === {len(db_ids)}")
    publish(job, orm(store, job, tasks, range(2031, 2041)))  # after the reconnect, live again
    db_ids = orm(stored_ids, job)
    wait_live(page, f"tfdashLive.pointsReceived >= {len(db_ids)}")

    final = state_of(page)
    assert final["points"] == len(db_ids) == history + 80
    assert final["duplicates"] == 0
    assert final["reconnects"] == 1
    assert final["cursor"] == db_ids[-1]
    assert final["downsampled"] is False
    assert page.evaluate("tfdashLive.pointIds()") == db_ids
    # Every try after the loss (refused while the server was down, then the one that opened) asked for what came
    # after the last point the page had seen.
    assert sockets[0].endswith("?since=0")
    assert len(sockets) >= 2 and all(url.endswith(f"?since={seen_before}") for url in sockets[1:]), sockets
    assert page.locator("#live-status").inner_text() == "live"

    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_function(
        "() => [...document.querySelectorAll('.chart .uplot')].every((u) => u.offsetWidth <= innerWidth)"
    )
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth"), "no sideways scrolling when narrow"
    page.screenshot(path=str(artifacts_dir / "job-page-390.png"), full_page=True)
    assert [e for e in errors if not NETWORK_NOISE.search(e)] == []


def test_a_user_who_may_not_see_the_job_gets_not_allowed_and_no_retry_loop(
    orm: Orm, web: WebServer, browser: Any
) -> None:
    scene = orm(make_scene)
    job = scene["job"]
    alice = browser.new_page()
    sign_in(alice, web, "alice", "pw-alice-123", f"/jobs/{job}/")
    alices_page = alice.request.get(f"{web.url}/jobs/{job}/").text()

    bob = browser.new_context().new_page()
    sockets: list[str] = []
    errors: list[str] = []
    bob.on("websocket", lambda ws: sockets.append(ws.url))
    bob.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(bob, web, "bob", "pw-bob-123", "/jobs/")
    assert bob.goto(f"{web.url}/jobs/{job}/").status == 404
    assert sockets == []

    # The page alone does not let him in either: served alice's page (as if his access ended after it loaded), the
    # client meets the server's refusal, says so, and stops.
    bob.route(
        f"{web.url}/jobs/{job}/", lambda route: route.fulfill(status=200, body=alices_page, content_type="text/html")
    )
    bob.goto(f"{web.url}/jobs/{job}/")
    wait_live(bob, "tfdashLive.status === 'not allowed'")
    assert bob.locator("#live-status").inner_text() == "not allowed"
    assert bob.evaluate("tfdashLive.retryScheduled") is False
    # No condition can show that nothing happens: watch for longer than the first two retries would take.
    bob.wait_for_timeout(2000)
    assert bob.evaluate("tfdashLive.connectAttempts") == 1
    assert len(sockets) == 1
    assert bob.evaluate("tfdashLive.pointsReceived") == 0
    assert errors == []
