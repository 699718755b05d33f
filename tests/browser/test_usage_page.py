"""The usage page in a real browser (issue 46): two weeks of tasks of five users in two groups, on a GPU and a CPU
cluster (one priced), recorded at their ends as the lifecycle records them, draw a stacked chart of device-hours per
user per day (uPlot, under the Content-Security-Policy: no error in the console) above a table whose numbers are the
API's. A screenshot is left in the test artifacts (usage-page-1280.png: docs/img/usage-page.png)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone
from playwright.sync_api import expect

from orchestrator.models import Cluster, Job, Task
from orchestrator.usage import recording
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_e2e import watch_errors
from tests.browser.test_job_live import sign_in
from tests.orchestrator.usage import scenes

pytestmark = pytest.mark.django_db(transaction=True)

USERS = {"maria": "vision", "jun": "vision", "amara": "speech", "lars": "speech", "priya": None}


def make_scene() -> dict[str, Any]:
    users = get_user_model().objects
    users.create_user("sam", password="pw-sam-123", is_staff=True)
    for name, group in USERS.items():
        user = users.create_user(name, password=f"pw-{name}-123")
        if group:
            user.groups.add(Group.objects.get_or_create(name=group)[0])
    gpu_host, cpu_host = scenes.online_host("gpu-lab", gpus=8), scenes.online_host("cpu-lab", cpu_slots=16)
    Cluster.objects.filter(name="gpu-lab").update(price_per_device_hour="2.40")
    rng = random.Random(46)
    today = timezone.now().date()
    for back in range(14, 0, -1):
        day = datetime.combine(today - timedelta(days=back), datetime.min.time(), UTC)
        for n, name in enumerate(USERS):
            if rng.random() < 0.3:
                continue
            host = gpu_host if n < 3 else cpu_host
            job = Job.objects.create(owner=users.get(username=name), cluster=host.cluster, name="train",
                                     strategy="mirrored", program_kind="builtin", builtin="digits_mlp")  # fmt: skip
            placed_at = day + timedelta(hours=rng.uniform(0, 20))
            task = Task.objects.create(
                job=job, type="worker", index=0, host=host, devices=list(range(rng.choice([1, 2, 4, 8]))),
                state="succeeded", placed_at=placed_at, started_at=placed_at,
                finished_at=placed_at + timedelta(hours=rng.uniform(1, 10)),
            )  # fmt: skip
            with transaction.atomic():
                recording.task_ended(Task.objects.select_related("job", "host").get(pk=task.pk))
    return {"from": str(today - timedelta(days=14)), "to": str(today)}


def test_the_usage_page_draws_device_hours_per_user_per_day_stacked(orm: Orm, web: WebServer, browser: Any,
                                                                    artifacts_dir):  # fmt: skip
    period = orm(make_scene)
    expected = orm(scenes.held)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = watch_errors(page)
    sign_in(page, web, "sam", "pw-sam-123", f"/usage/?from={period['from']}&to={period['to']}")

    page.wait_for_function("() => window.tfdashUsage && window.tfdashUsage.drawn", timeout=15_000)
    assert page.evaluate("window.tfdashUsage.accounts") == len(expected)
    assert page.evaluate("window.tfdashUsage.days") == 15
    expect(page.locator(".usage-chart .u-legend")).to_contain_text("maria")
    rows = page.locator("#usage-table tbody tr")
    expect(rows).to_have_count(len(expected))
    for name, seconds in expected.items():
        cell = page.locator(f'#usage-table tr[data-account="{name}"] td[data-seconds]')
        assert abs(float(cell.get_attribute("data-seconds")) - seconds) < 0.5
    expect(page.locator("#usage-table thead")).to_contain_text("Cost (showback)")
    page.screenshot(path=str(artifacts_dir / "usage-page-1280.png"), full_page=True)  # docs/img/usage-page.png
    assert errors == []

    # Per group: vision and speech; priya is in none.
    page.select_option("#usage-by", "group")
    page.click("#usage-filters button[type=submit]")
    page.wait_for_function("() => window.tfdashUsage && window.tfdashUsage.drawn", timeout=15_000)
    expect(page.locator("#usage-table tbody tr")).to_have_count(2)
    assert errors == []
