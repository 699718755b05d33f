"""The job page lives on its one socket: a task's state change and a task's new log line reach the page while it makes
no HTTP request at all after loading (no polling); a page whose server died gets, once it is back, exactly the log
lines it missed."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from contracts.protocol import TASK_LOGS
from orchestrator.metrics import ingest
from orchestrator.models import Job, Task
from tests import factories
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_e2e import watch_errors
from tests.browser.test_job_live import NETWORK_NOISE, WAIT_MS, sign_in, wait_live
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db(transaction=True)


def make_scene() -> dict[str, Any]:
    alice = get_user_model().objects.create_user("alice", password="pw-alice-123")
    host, token = factories.host("sock-node")
    job = Job.objects.create(
        owner=alice, cluster=host.cluster, name="sock", strategy="multi_worker_mirrored", program_kind="script",
        workers=2, attempt=1, state="running",
    )  # fmt: skip
    tasks = [
        Task.objects.create(job=job, attempt=1, type="worker", index=i, host=host, state="running") for i in range(2)
    ]
    return {"job": job.pk, "tasks": [t.pk for t in tasks], "host": host.name, "token": token}


def print_lines(scene: dict[str, Any], task_id: int, lines: list[tuple[int, str]]) -> int:
    """What an agent sends when the task prints: stored by the orchestrator's own handler."""
    body = {"task_id": task_id, "attempt": 1, "lines": [[seq, "stdout", text] for seq, text in lines]}
    envelope = sealed(scene["host"], scene["token"], TASK_LOGS, body)
    return ingest.handle_task_logs(envelope)


def fail(task_id: int) -> None:
    task = Task.objects.get(pk=task_id)
    task.state, task.exit_code = "failed", 3
    task.save()


def test_a_task_state_and_a_new_log_line_arrive_over_the_socket_with_no_http_polling(
    orm: Orm, web: WebServer, browser: Any
) -> None:
    scene = orm(make_scene)
    job, (w0, w1) = scene["job"], scene["tasks"]
    orm(print_lines, scene, w0, [(0, "epoch 1 starts")])
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = watch_errors(page)
    sign_in(page, web, "alice", "pw-alice-123", f"/jobs/{job}/")
    wait_live(page, "tfdashLive.status === 'live'")
    expect(page.locator("#log-tail-text")).to_contain_text("epoch 1 starts")
    requests: list[str] = []
    page.on("request", lambda request: requests.append(f"{request.method} {request.url} ({request.resource_type})"))

    orm(fail, w1)
    expect(page.locator(f'tr[data-task-id="{w1}"] .state')).to_have_text("failed", timeout=WAIT_MS)
    orm(print_lines, scene, w0, [(1, "epoch 1 ends: loss 0.42")])
    expect(page.locator("#log-tail-text")).to_contain_text("epoch 1 ends: loss 0.42", timeout=WAIT_MS)
    # Another task's tab shows its own lines, which came over the same socket.
    orm(print_lines, scene, w1, [(0, "worker 1 says goodbye")])
    wait_live(page, "tfdashLive.logLinesReceived >= 2")
    page.locator(".log-tabs button", has_text="worker 1").click()
    expect(page.locator("#log-tail-text")).to_contain_text("worker 1 says goodbye")
    expect(page.locator("#log-tail .log-tail-head")).to_contain_text("worker 1")

    assert requests == [], requests  # everything above came over the WebSocket
    assert page.evaluate("tfdashLive.jobFrames") >= 2 and page.evaluate("tfdashLive.taskFrames") >= 2
    assert errors == [], errors


def test_a_page_that_reconnects_gets_the_log_lines_it_missed_and_none_twice(
    orm: Orm, web: WebServer, browser: Any
) -> None:
    scene = orm(make_scene)
    job, (w0, w1) = scene["job"], scene["tasks"]
    orm(print_lines, scene, w0, [(seq, f"line {seq}") for seq in range(3)])
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = watch_errors(page)
    sockets: list[dict[str, Any]] = []  # per socket: its query and the log frames it brought

    def watch(ws: Any) -> None:
        seen: dict[str, Any] = {"query": parse_qs(urlsplit(ws.url).query), "logs": []}
        sockets.append(seen)
        ws.on("framereceived", lambda payload: _keep_log_frame(seen["logs"], payload))

    page.on("websocket", watch)
    sign_in(page, web, "alice", "pw-alice-123", f"/jobs/{job}/")
    wait_live(page, "tfdashLive.status === 'live'")
    expect(page.locator("#log-tail-text")).to_contain_text("line 2")
    # The page came with worker 0's last lines: its socket asked only for what follows them, and got nothing.
    assert sockets[0]["query"]["log_since"] == [f"{w0}:2"] and sockets[0]["logs"] == []

    web.kill()
    wait_live(page, "tfdashLive.status === 'reconnecting'")
    orm(print_lines, scene, w0, [(seq, f"line {seq}") for seq in range(6)])  # 3-5 new, 0-2 delivered again
    orm(print_lines, scene, w1, [(0, "worker 1 wakes up")])
    web.start()
    wait_live(page, "tfdashLive.status === 'live' && tfdashLive.reconnects === 1")
    expect(page.locator("#log-tail-text")).to_contain_text("line 5")

    back = sockets[-1]
    assert back["query"]["log_since"] == [f"{w0}:2"]
    assert {frame["task"]: [line[0] for line in frame["lines"]] for frame in back["logs"]} == {w0: [3, 4, 5], w1: [0]}
    shown = page.locator("#log-tail-text span").all_inner_texts()
    assert shown == [f"line {seq}" for seq in range(6)]
    assert page.evaluate("tfdashLive.logLinesReceived") == 4  # 3, 4, 5 and worker 1's line: each once
    assert [e for e in errors if not NETWORK_NOISE.search(e)] == []


def _keep_log_frame(logs: list[dict[str, Any]], payload: str | bytes) -> None:
    frame = json.loads(payload)
    if frame.get("type") == "log":
        logs.append(frame)
