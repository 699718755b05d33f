"""The verdict reaches an open job page when the job ends, in a real browser, without a reload (issue 45): a running
two-worker job whose worker 1 raises (the events an agent sends, applied as the lifecycle does; the verdict made
after the job's end commits) shows "Why it failed" above the failed task's block, the hint, the cause linked to its
log, and, collapsed until opened, worker 0 that failed because of it. What the tasks printed (here a peer's error
holding markup) shows as text and runs nothing. A screenshot of the verdict is left in the test artifacts
(job-verdict-1280.png: the README's docs/img/job-verdict.png)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from contracts.task_messages import TaskEventKind
from orchestrator.models import Job, Task
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_e2e import watch_errors
from tests.browser.test_job_live import WAIT_MS, sign_in, wait_live
from tests.orchestrator.diagnosis.test_store import say
from tests.orchestrator.jobs.test_restarts import apply, running_job, task_of

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = '<img src=x onerror="window.pwned = (window.pwned || 0) + 1">'
TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/jobs/7/train.py", line 42, in <module>',
    "    model.fit(dataset)",
    "ValueError: Input 0 of layer dense_1 is incompatible: expected shape (None, 64), found (None, 10)",
]
# What a peer printed is the script's text too: it must show as text.
PEER = [f"tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted by: {HOSTILE}"]


def make_scene() -> dict[str, Any]:
    alice = get_user_model().objects.create_user("alice", password="pw-alice-123")
    job = running_job(alice, max_restarts=0)
    Job.objects.filter(pk=job.pk).update(name="digits-mwms")
    cause, peer = task_of(job, "worker", 1), task_of(job, "worker", 0)
    say(cause, ["epoch 1/3", *TRACEBACK])
    return {"job": job.pk, "cause": cause.pk, "peer": peer.pk, "cause_label": cause.label}


def fail(scene: dict[str, Any]) -> None:
    """Worker 1 exits 1: the job fails and stops worker 0, whose UnavailableError comes in as it is stopped."""
    apply(Task.objects.get(pk=scene["cause"]), TaskEventKind.EXITED, exit_code=1)
    peer = Task.objects.get(pk=scene["peer"])
    say(peer, PEER)
    apply(peer, TaskEventKind.EXITED, exit_code=-9, detail="job failed")


def test_an_open_job_page_shows_why_the_job_failed_when_it_ends(orm: Orm, web: WebServer, browser: Any, artifacts_dir):
    scene = orm(make_scene)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = watch_errors(page)
    sign_in(page, web, "alice", "pw-alice-123", f"/jobs/{scene['job']}/")
    wait_live(page, "tfdashLive.status === 'live'")
    expect(page.locator("#verdict")).to_have_count(0)

    orm(fail, scene)

    verdict = page.locator("#verdict")
    title = f"Why it failed: {scene['cause_label']} raised ValueError"
    expect(verdict.locator("#verdict-title")).to_have_text(title, timeout=WAIT_MS)
    expect(verdict.locator("#verdict-message")).to_have_text(
        f"{scene['cause_label']} raised ValueError at train.py:42: Input 0 of layer dense_1 is incompatible: "
        "expected shape (None, 64), found (None, 10)"
    )
    expect(verdict.locator("#verdict-hint")).to_contain_text("What to do: Fix the error at train.py:42")
    cause_link = verdict.locator("#verdict-cause a")
    expect(cause_link).to_have_attribute("href", f"/jobs/{scene['job']}/tasks/{scene['cause']}/log/")
    expect(verdict.locator("#verdict-evidence")).to_contain_text('File "/jobs/7/train.py", line 42')
    # Worker 0's failure is listed once it has stopped, collapsed until opened.
    peers = verdict.locator("#verdict-peers")
    expect(peers.locator("summary")).to_have_text("1 other task failed because of it", timeout=WAIT_MS)
    expect(peers.locator("li")).to_be_hidden()
    # In the page, at once: a later frame may render the live part again between a locator's lookup and its scroll.
    page.evaluate("() => document.getElementById('verdict').scrollIntoView()")
    page.screenshot(path=str(artifacts_dir / "job-verdict-1280.png"))  # docs/img/job-verdict.png
    peers.locator("summary").click()
    expect(peers.locator("li")).to_contain_text(f"UnavailableError: Collective ops is aborted by: {HOSTILE}")
    # Above the failed task's own block, which keeps its exit code and tail.
    assert page.evaluate(
        "() => !!(document.getElementById('verdict').compareDocumentPosition(document.getElementById('failure'))"
        " & Node.DOCUMENT_POSITION_FOLLOWING)"
    )
    expect(page.locator("#failure h2")).to_contain_text("failed with exit code 1")
    assert page.evaluate("window.pwned") is None and page.locator("#job-live img").count() == 0
    assert orm(lambda: Job.objects.get(pk=scene["job"]).state) == "failed"
    assert not errors, errors
