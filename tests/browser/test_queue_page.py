"""The queue page in a real browser: a waiting user sees their place and latest start and no one else's job names;
staff hold a job and move another to a higher class from the page, and the order and the jobs' histories follow."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from orchestrator.models import Host, Job, PriorityClass
from orchestrator.scheduler import scheduling
from tests import factories
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_live import WAIT_MS, sign_in

pytestmark = pytest.mark.django_db(transaction=True)


def make_queue() -> dict[str, Any]:
    users = get_user_model().objects
    alice = users.create_user("alice", password="pw-alice-123")
    bob = users.create_user("bob", password="pw-bob-123")
    users.create_superuser("root", password="pw-root-123")
    host, _ = factories.host("queue-0", port_min=26500)
    Host.objects.filter(pk=host.pk).update(cpu_slots=1, status="online")
    normal = PriorityClass.objects.get_or_create(name="normal", defaults={"value": 100, "is_default": True})[0]
    PriorityClass.objects.get_or_create(name="high", defaults={"value": 200})

    def job(owner: Any, name: str) -> Job:
        return Job.objects.create(owner=owner, cluster=host.cluster, name=name, strategy="mirrored",
                                  program_kind="builtin", builtin="digits_mlp", time_limit_s=600,
                                  priority_class=normal)  # fmt: skip

    running = job(bob, "bob's running job")
    scheduling.schedule_cluster(host.cluster_id)
    bobs = job(bob, "bob's secret plan")
    alices = job(alice, "alice's waiting job")
    scheduling.schedule_cluster(host.cluster_id)
    return {"cluster": host.cluster_id, "running": running.pk, "bobs": bobs.pk, "alices": alices.pk}


def rows(page: Any) -> list[str]:
    return page.locator("#queue tbody tr").evaluate_all("(rows) => rows.map((r) => r.id)")


def test_staff_reorder_the_queue_from_the_page_and_users_see_only_their_own_names(
    orm: Orm, web: WebServer, browser: Any
) -> None:
    s = orm(make_queue)
    page = browser.new_page()
    sign_in(page, web, "alice", "pw-alice-123", f"/clusters/{s['cluster']}/queue/")

    expect(page.locator("#queue")).to_be_visible(timeout=WAIT_MS)
    # Fair share: bob already runs a job, alice nothing, so her later job goes first.
    assert rows(page) == [f"queue-job-{s['alices']}", f"queue-job-{s['bobs']}"]
    mine = page.locator(f"#queue-job-{s['alices']}")
    expect(mine).to_contain_text("alice's waiting job")
    expect(mine.locator(".expected-start")).not_to_have_text("—")
    expect(page.locator(f"#queue-job-{s['bobs']}")).not_to_contain_text("secret plan")
    expect(page.locator(".staff-actions")).to_have_count(0)

    page.locator("header form.who button").click()
    sign_in(page, web, "root", "pw-root-123", f"/clusters/{s['cluster']}/queue/")
    page.locator(f"#queue-job-{s['alices']} button.hold").click()
    expect(page.locator(f"#queue-job-{s['alices']}")).to_contain_text("held", timeout=WAIT_MS)
    bobs = page.locator(f"#queue-job-{s['bobs']}")
    bobs.locator("select[name=priority]").select_option("high")
    bobs.locator("button.set-priority").click()
    page.wait_for_function(
        f"() => document.querySelector('#queue tbody tr').id === 'queue-job-{s['bobs']}'", timeout=WAIT_MS
    )
    page.goto(f"{web.url}/jobs/{s['bobs']}/")
    expect(page.locator("#job-story")).to_contain_text("priority normal -> high by root", timeout=WAIT_MS)
    page.goto(f"{web.url}/jobs/{s['alices']}/")
    expect(page.locator("#job-story")).to_contain_text("held by root", timeout=WAIT_MS)


@pytest.mark.parametrize("width", [1280, 390])
def test_the_queue_page_shows_what_the_api_says_at_1280_and_390_px(
    orm: Orm, web: WebServer, browser: Any, width: int
) -> None:
    s = orm(make_queue)
    page = browser.new_page(viewport={"width": width, "height": 900})
    sign_in(page, web, "alice", "pw-alice-123", f"/clusters/{s['cluster']}/queue/")
    expect(page.locator("#queue")).to_be_visible(timeout=WAIT_MS)

    api = page.request.get(f"{web.url}/api/clusters/{s['cluster']}/queue/").json()
    shown = page.locator("#queue tbody tr").evaluate_all(
        """(rows) => rows.map((r) => ({id: r.id, position: r.querySelector('.position').textContent.trim(),
             start: r.querySelector('.expected-start').textContent.trim(),
             reason: r.querySelector('.reason').textContent.trim()}))"""
    )

    def start_text(value: str | None) -> str:  # the page's format, in the server's zone (UTC)
        return (
            datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
            if value
            else "—"
        )

    assert shown == [
        {"id": f"queue-job-{row['id']}", "position": str(row["position"]), "start": start_text(row["expected_start"]),
         "reason": row["reason"]}
        for row in api
    ]  # fmt: skip
    assert all(row["expected_start"] for row in api) and api[0]["reason"]  # planned, and her own job says why
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth"), "the table scrolls, not the page"
