"""The job page lives on its one socket: a task's state change and a task's new log line reach the page while it makes
no HTTP request at all after loading (no polling)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from orchestrator.agents import events
from orchestrator.models import Job, Task
from tests import factories
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_e2e import watch_errors
from tests.browser.test_job_live import WAIT_MS, sign_in, wait_live

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
    envelope = {"host": scene["host"], "token": scene["token"], "body": body, "sent_at": time.time(), "protocol": 1}
    return events.handle_task_logs(envelope)


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
