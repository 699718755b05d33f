"""The cluster page in a real browser with real agents: both local hosts online, their device slots, and live load
(the agents' CPU/memory samples through the metric stream and the ingest); staff get admin links; keyboard and
narrow screens work. Screenshots go to test-artifacts/."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_e2e import make_user, start_cluster, watch_errors
from tests.browser.test_job_live import sign_in
from tests.support.processes import ManagedProcess

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_MS = 30_000
HOSTS = ["cl-page-0", "cl-page-1"]


def test_the_cluster_page_shows_the_local_hosts_online_with_slots_and_live_load(
    orm: Orm, web: WebServer, browser: Any, orchestrator: ManagedProcess, start_agent: Any, artifacts_dir: Path
) -> None:
    orm(make_user, staff=True)
    start_cluster(orm, start_agent, HOSTS, first_port=29500)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = watch_errors(page)
    sign_in(page, web, "alice", "pw-alice-123", "/clusters/")

    for name in HOSTS:
        row = page.locator(f'tr[data-host="{name}"]')
        expect(row).to_have_attribute("data-status", "online", timeout=WAIT_MS)
        expect(row.locator(".status")).to_have_text("online")
        expect(row.locator("td.slots")).to_contain_text("0 used / 2 free")
        # Live load: the agent samples every second; the ingest stores it; the table's poll shows the latest.
        expect(row.locator("td.load-cpu")).to_have_text(re.compile(r"\d+ %"), timeout=WAIT_MS)
        expect(row.locator("td.load-mem")).to_have_text(re.compile(r" of .*\(\d+ %\)"), timeout=WAIT_MS)
        expect(row.locator("td.load-gpu")).to_have_text("—")  # no GPU here
    expect(page.locator(".cluster-summary")).to_contain_text("2 of 2 hosts online")
    expect(page.locator(".cluster-summary .slots-free")).to_have_text("4")

    # Staff: an admin link per host, reachable with the keyboard.
    link = page.locator(f'tr[data-host="{HOSTS[0]}"] a', has_text=HOSTS[0])
    expect(link).to_have_attribute("href", re.compile(r"^/admin/orchestrator/host/\d+/change/$"))
    link.focus()
    assert page.evaluate("document.activeElement.textContent") == HOSTS[0]
    page.screenshot(path=str(artifacts_dir / "cluster-page-1280.png"), full_page=True)

    page.set_viewport_size({"width": 390, "height": 844})
    expect(page.locator(f'tr[data-host="{HOSTS[1]}"]')).to_be_attached()
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth"), "the table scrolls, not the page"
    page.screenshot(path=str(artifacts_dir / "cluster-page-390.png"), full_page=True)
    assert errors == []


def test_a_host_whose_agent_stops_turns_offline_and_shows_no_load(
    orm: Orm, web: WebServer, browser: Any, orchestrator: ManagedProcess, start_agent: Any
) -> None:
    orm(make_user)
    start_cluster(orm, start_agent, ["cl-gone-0"], first_port=29600)
    page = browser.new_page()
    sign_in(page, web, "alice", "pw-alice-123", "/clusters/")
    row = page.locator('tr[data-host="cl-gone-0"]')
    expect(row.locator("td.load-cpu")).to_have_text(re.compile(r"\d+ %"), timeout=WAIT_MS)
    assert row.locator("a").count() == 0  # not staff: no admin link

    start_agent.started[0].kill()  # type: ignore[attr-defined]
    # The watchdog marks it offline after the heartbeat timeout (4 s in tests).
    expect(row).to_have_attribute("data-status", "offline", timeout=WAIT_MS)
    expect(row.locator("td.load-cpu")).to_have_text("—")
