"""Every page runs under the Content-Security-Policy with no violation, in a real browser: the user's pages (the job
page live on its socket, the form with its htmx calculator, the comparison and experiment charts, the cluster page's
htmx refresh, the browsable API) and the Django admin, used for real (a host registered through its form). And the
policy bites: an inline script put into a page does not run, and is reported."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from playwright.sync_api import expect

from orchestrator.models import Experiment, Host, Job, Task
from tests import factories
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_compare import make_scene as make_finished_jobs
from tests.browser.test_job_live import WAIT_MS, sign_in, wait_live
from tests.dashboard.test_experiment_pages import form_post

pytestmark = pytest.mark.django_db(transaction=True)

# Chromium reports each violation on the page (the event) and in the console ("Refused to ..."); both are watched.
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) => {
  const where = `${e.sourceFile}:${e.lineNumber}`;
  window.tfdashViolation(`${e.violatedDirective} blocked ${e.blockedURI || "inline"} at ${where}`);
});
"""


def make_scene() -> dict[str, Any]:
    ids = make_finished_jobs()  # alice's two finished jobs and a running one
    users = get_user_model().objects
    alice = users.get(username="alice")
    users.create_superuser("root", password="pw-root-123")
    for i in range(2):
        host, _ = factories.host(f"csp-{i}", port_min=26000 + 100 * i)
        Host.objects.filter(pk=host.pk).update(cpu_slots=2, status="online")
    host = Host.objects.get(name="csp-0")
    running = Job.objects.get(pk=ids["running"])
    task = Task.objects.create(job=running, attempt=1, type="worker", index=0, host=host, state="running")
    Job.objects.filter(pk=running.pk).update(attempt=1)
    client = Client()
    client.force_login(alice)
    response = client.post("/jobs/new/", form_post(cluster=host.cluster_id))
    assert response.status_code == 302, response.content[-2000:]
    return {
        **ids,
        "task": task.pk,
        "experiment": Experiment.objects.get().pk,
        "host": host.pk,
        "cluster": host.cluster_id,
        "alice": alice.pk,
    }


def watch(page: Any) -> list[str]:
    problems: list[str] = []
    page.expose_function("tfdashViolation", lambda text: problems.append(f"violation: {text}"))
    page.add_init_script(REPORT_VIOLATIONS)
    page.on(
        "console", lambda msg: msg.type == "error" and not _favicon(msg) and problems.append(f"console: {msg.text}")
    )
    page.on("pageerror", lambda exc: problems.append(f"pageerror: {exc}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    return problems


def _favicon(message: Any) -> bool:
    """Chromium asks for /favicon.ico where a page names no icon (the admin's, the browsable API's): a 404, no error."""
    return str(message.location.get("url", "")).endswith("/favicon.ico")


def visit(page: Any, url: str, ready: Any = None) -> None:
    """Open `url`, check it came with the policy, and let it settle (`ready` waits for its scripts' work)."""
    response = page.goto(url)
    assert response is not None and response.ok, url
    policy = response.headers.get("content-security-policy", "")
    assert "script-src 'self'" in policy and "object-src 'none'" in policy, url
    if ready is not None:
        ready()
    page.wait_for_load_state("networkidle")


def test_every_page_runs_under_the_policy_with_no_violation(orm: Orm, web: WebServer, browser: Any) -> None:
    s = orm(make_scene)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = watch(page)

    visit(page, f"{web.url}/accounts/login/")
    sign_in(page, web, "alice", "pw-alice-123", "/jobs/")
    expect(page.locator("table.jobs")).to_be_visible(timeout=WAIT_MS)
    visit(page, f"{web.url}/jobs/?state=finished")
    visit(page, f"{web.url}/jobs/new/", lambda: expect(page.locator("#calc-out")).not_to_be_empty(timeout=WAIT_MS))
    page.fill("#id_name", "typed")  # the calculator asks again (htmx, triggered by input)
    visit(page, f"{web.url}/jobs/new/?from={s['digits-mw']}&compare=1")
    visit(page, f"{web.url}/jobs/{s['running']}/", lambda: wait_live(page, "tfdashLive.status === 'live'"))
    visit(page, f"{web.url}/jobs/{s['digits-mw']}/", lambda: wait_live(page, "tfdashLive.status === 'live'"))
    visit(page, f"{web.url}/jobs/{s['running']}/tasks/{s['task']}/log/")
    visit(
        page,
        f"{web.url}/jobs/compare/?ids={s['digits-mw']}&ids={s['digits-ps']}",
        lambda: expect(page.locator("#charts .uplot").first).to_be_visible(timeout=WAIT_MS),
    )
    visit(page, f"{web.url}/experiments/{s['experiment']}/")

    def refreshed_by_htmx() -> None:
        with page.expect_response(re.compile(r"/clusters/hosts/"), timeout=WAIT_MS):
            pass

    visit(page, f"{web.url}/clusters/", refreshed_by_htmx)
    visit(page, f"{web.url}/clusters/{s['cluster']}/queue/")
    visit(page, f"{web.url}/tokens/")
    visit(page, f"{web.url}/api/jobs/")  # DRF's browsable API
    assert problems == []

    # The admin, as staff, used for real: its lists, forms and widgets, and a host registered through its form.
    visit(page, f"{web.url}/jobs/")
    page.locator("header form.who button").click()  # sign out: a form post under form-action 'self'
    expect(page.locator("#id_username")).to_be_visible(timeout=WAIT_MS)
    sign_in(page, web, "root", "pw-root-123", "/admin/")
    expect(page.locator("#site-name")).to_be_visible(timeout=WAIT_MS)
    for path in (
        "/admin/",
        "/admin/orchestrator/host/",
        f"/admin/orchestrator/host/{s['host']}/change/",
        f"/admin/orchestrator/cluster/{s['cluster']}/change/",
        "/admin/orchestrator/job/",
        "/admin/orchestrator/apitoken/",
        "/admin/orchestrator/priorityclass/",
        f"/clusters/{s['cluster']}/queue/",  # with the staff's hold and priority forms
        "/admin/auth/user/",
        f"/admin/auth/user/{s['alice']}/change/",
        f"/admin/auth/user/{s['alice']}/password/",
    ):
        visit(page, f"{web.url}{path}")
    expect(page.locator("b.host-status")).to_have_count(0)  # the last page was not the host list
    visit(page, f"{web.url}/admin/orchestrator/host/")
    expect(page.locator("b.host-status-online").first).to_have_css("color", "rgb(26, 127, 55)")
    visit(page, f"{web.url}/admin/orchestrator/host/add/")
    page.select_option("#id_cluster", str(s["cluster"]))
    page.fill("#id_name", "csp-new")
    page.fill("#id_address", "10.9.0.1")
    page.fill("#id_port_min", "27000")
    page.fill("#id_port_max", "27099")
    page.locator("input[name=_save]").click()
    expect(page.locator(".messagelist")).to_contain_text("Agent token for csp-new", timeout=WAIT_MS)
    page.wait_for_load_state("networkidle")
    assert problems == []

    # The policy bites, and the watch sees it: an inline script added to the page does not run.
    page.evaluate(
        "() => { const s = document.createElement('script'); s.textContent = 'window.ranInline = 1';"
        " document.body.append(s); }"
    )
    page.wait_for_function("() => true")
    expect(page.locator("body")).to_be_visible()
    assert page.evaluate("window.ranInline") is None
    page.wait_for_timeout(200)  # the violation report is an event, dispatched after the script was refused
    assert any("script-src" in p for p in problems), problems
