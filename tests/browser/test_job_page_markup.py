"""Text that comes from hosts and scripts reaches the job page as text, in a real browser: a log line, a task's
detail, the job's reason and facts, a task's facts frame, each holding `<img src=x onerror=...>`, show literally and
run nothing, whether served with the page or pushed over its socket. A frame put on the job's group by someone else
(a `job` frame with markup, a `log` frame) never reaches the page. The job frame's markup is built again from an
allow-list, never put into innerHTML: what it builds is what the server renders, and hostile markup handed to it
directly loses its scripts, handlers, images and foreign links."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from contracts.protocol import TASK_LOGS
from orchestrator.metrics import ingest, live
from orchestrator.models import Job, Task
from tests import factories
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_e2e import watch_errors
from tests.browser.test_job_live import WAIT_MS, sign_in, wait_live
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = '<img src=x onerror="window.pwned = (window.pwned || 0) + 1">'


def make_scene() -> dict[str, Any]:
    alice = get_user_model().objects.create_user("alice", password="pw-alice-123")
    host, token = factories.host("markup-node")
    job = Job.objects.create(
        owner=alice, cluster=host.cluster, name="markup", strategy="multi_worker_mirrored", program_kind="script",
        workers=2, attempt=1, state="running", reason=f"served: {HOSTILE}",
    )  # fmt: skip
    tasks = [
        Task.objects.create(job=job, attempt=1, type="worker", index=i, host=host, state="running") for i in range(2)
    ]
    body = {"task_id": tasks[0].pk, "attempt": 1, "lines": [[0, "stdout", f"printed: {HOSTILE}"]]}
    ingest.handle_task_logs(sealed(host.name, token, TASK_LOGS, body))
    return {"job": job.pk, "tasks": [t.pk for t in tasks]}


def turn_hostile(scene: dict[str, Any]) -> None:
    """What a hostile host's reports and a hostile script leave in the rows; the saves send the job's hint."""
    task = Task.objects.get(pk=scene["tasks"][1])
    task.state, task.exit_code, task.detail = "failed", 1, f"detail: {HOSTILE}"
    task.save()
    job = Job.objects.get(pk=scene["job"])
    job.reason, job.failed_task, job.facts = f"pushed: {HOSTILE}", task, {HOSTILE: HOSTILE}
    job.save()


def test_hostile_text_shows_as_text_and_runs_nothing(orm: Orm, web: WebServer, browser: Any) -> None:
    scene = orm(make_scene)
    job = scene["job"]
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = watch_errors(page)
    image_requests: list[str] = []
    page.on("request", lambda r: r.resource_type == "image" and image_requests.append(r.url))
    sign_in(page, web, "alice", "pw-alice-123", f"/jobs/{job}/")
    wait_live(page, "tfdashLive.status === 'live'")
    expect(page.locator("#job-reason")).to_have_text(f"served: {HOSTILE}")
    expect(page.locator("#log-tail-text")).to_contain_text(f"printed: {HOSTILE}")

    # Over the socket: the job frame's markup, and a task's facts frame.
    orm(turn_hostile, scene)
    expect(page.locator("#job-reason")).to_have_text(f"pushed: {HOSTILE}", timeout=WAIT_MS)
    expect(page.locator("#failure")).to_contain_text(f"detail: {HOSTILE}")
    expect(page.locator("#job-facts")).to_contain_text(HOSTILE)
    # Frames on the job's group that the control plane never publishes: dropped by the socket. The facts frame after
    # them is relayed, so once it shows, the forged ones have been handled.
    orm(live.publish, job, {"type": "job", "state": "running", "html": f'{HOSTILE}<p id="forged">forged</p>'})
    orm(live.publish, job, {"type": "log", "task": scene["tasks"][0], "lines": [[99, "stdout", "forged line"]]})
    orm(live.publish, job, {"type": "facts", "task": scene["tasks"][0], "facts": {HOSTILE: f"fact: {HOSTILE}"}})
    expect(page.locator("#task-facts")).to_contain_text(f"fact: {HOSTILE}", timeout=WAIT_MS)

    assert page.evaluate("window.pwned") is None
    assert page.locator("#job-live img, #log-tail img, #task-facts img").count() == 0
    assert page.locator("#forged").count() == 0
    expect(page.locator("#log-tail-text")).not_to_contain_text("forged line")
    assert image_requests == []
    assert errors == []

    # The markup built from the frame is exactly what the server renders: a fresh load of the page shows the same.
    fresh = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(fresh, web, "alice", "pw-alice-123", f"/jobs/{job}/")
    wait_live(fresh, "tfdashLive.status === 'live'")
    normalized = "document.getElementById('job-live').innerHTML.replace(/\\s+/g, ' ').trim()"
    assert page.evaluate(normalized) == fresh.evaluate(normalized)


def test_the_markup_builder_keeps_the_partials_tags_and_drops_everything_else(
    orm: Orm, web: WebServer, browser: Any
) -> None:
    scene = orm(make_scene)
    page = browser.new_page()
    sign_in(page, web, "alice", "pw-alice-123", f"/jobs/{scene['job']}/")
    wait_live(page, "tfdashLive.status === 'live'")
    hostile = (
        '<div class="kept" data-x="1">text <b>bold</b> &lt;escaped&gt;'
        f"{HOSTILE}<script>window.pwned = 2</script>"
        '<a href="javascript:window.pwned = 3">js</a><a href="https://elsewhere.example/">off</a>'
        '<a href="/jobs/" download>on</a><span onclick="window.pwned = 4" style="color: red" title="t">s</span>'
        '<svg><a href="/x"><text>svg</text></a></svg><iframe src="/jobs/"></iframe><form action="/x"><input></form>'
        "<style>div { display: none }</style></div>"
    )
    built = page.evaluate(
        """async (html) => {
            const { replaceWithMarkup } = await import("/static/dashboard/live/markup.js");
            const box = document.createElement("div");
            document.body.append(box);
            replaceWithMarkup(box, html);
            return box.innerHTML;
        }""",
        hostile,
    )
    assert built == (
        '<div class="kept" data-x="1">text <b>bold</b> &lt;escaped&gt;'
        '<a>js</a><a>off</a><a href="/jobs/" download="">on</a><span title="t">s</span></div>'
    )
    assert page.evaluate("window.pwned") is None
