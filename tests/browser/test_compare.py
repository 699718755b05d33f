"""Comparing two finished jobs in a real browser: filter the list, tick two jobs by keyboard, open the comparison,
read both jobs' epoch times and final metrics, switch the charts to a wall-time axis; at 1280 px and at 390 px."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from orchestrator.models import Job, MetricPoint, Task
from tests import factories
from tests.browser.conftest import Orm, WebServer

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_MS = 15_000
T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


def make_scene() -> dict[str, int]:
    alice = get_user_model().objects.create_user("alice", password="pw-alice-123")
    cluster = factories.cluster()
    ids: dict[str, int] = {}
    for name, strategy, epoch_times, losses, accuracies in (
        ("digits-mw", "multi_worker_mirrored", (12.24, 8.5), (0.91, 0.4321), (0.61, 0.8765)),
        ("digits-ps", "parameter_server", (15.76, 14.5), (0.88, 0.3456), (0.63, 0.9012)),
    ):
        ps = strategy == "parameter_server"
        job = Job.objects.create(
            owner=alice,
            cluster=cluster,
            name=name,
            strategy=strategy,
            program_kind="script",
            workers=2,
            ps=1 if ps else 0,
            attempt=1,
            state="succeeded",
            started_at=T0,
            finished_at=T0 + timedelta(seconds=60),
        )
        speaker = Task.objects.create(
            job=job, attempt=1, type="chief" if ps else "worker", index=0, state="succeeded", started_at=T0
        )
        end = T0.timestamp() + 3
        for epoch, (wall, loss, accuracy) in enumerate(zip(epoch_times, losses, accuracies, strict=True), start=1):
            end += wall
            values = {"loss": loss, "accuracy": accuracy, "epoch_time_s": wall}
            MetricPoint.objects.bulk_create(
                MetricPoint(
                    job=job, task=speaker, phase="epoch_end", name=n, step=epoch * 10, epoch=epoch, value=v, ts=end
                )
                for n, v in values.items()
            )
        ids[name] = job.pk
    # Not finished: cannot be ticked.
    ids["running"] = Job.objects.create(
        owner=alice, cluster=cluster, name="still-going", strategy="mirrored", program_kind="script", state="running"
    ).pk
    return ids


def test_two_finished_jobs_compared_side_by_side(orm: Orm, web: WebServer, browser: Any, artifacts_dir: Path) -> None:
    ids = orm(make_scene)
    mw, ps = ids["digits-mw"], ids["digits-ps"]
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    page.goto(f"{web.url}/accounts/login/?next=/jobs/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw-alice-123")
    page.click("form.login button[type=submit]")
    expect(page.locator("table.jobs")).to_be_visible(timeout=WAIT_MS)

    page.select_option("#filter-state", "finished")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"/jobs/\?(.*&)?state=finished(&|$)"), timeout=WAIT_MS)
    expect(page.locator("table.jobs tbody tr")).to_have_count(2)
    expect(page.locator(f"tr[data-job='{ids['running']}']")).to_have_count(0)

    # The checkboxes work from the keyboard: focus one, Space ticks it.
    first = page.get_by_label(f"Compare job #{mw} digits-mw")
    first.focus()
    page.keyboard.press("Space")
    expect(first).to_be_checked()
    page.get_by_label(f"Compare job #{ps} digits-ps").check()
    page.get_by_role("button", name="Compare selected").click()

    expect(page).to_have_url(f"{web.url}/jobs/compare/?ids={ps}&ids={mw}", timeout=WAIT_MS)
    summary = page.locator("#compare-summary")
    expect(summary.locator("thead")).to_contain_text("digits-mw")
    expect(summary.locator("thead")).to_contain_text("digits-ps")
    expect(summary.locator("tr[data-row='mean_epoch_s']")).to_contain_text("10.4 s")  # (12.24 + 8.5) / 2
    expect(summary.locator("tr[data-row='mean_epoch_s']")).to_contain_text("15.1 s")
    expect(summary.locator("tr[data-row='final_loss']")).to_contain_text("0.4321")
    expect(summary.locator("tr[data-row='final_loss']")).to_contain_text("0.3456")
    expect(summary.locator("tr[data-row='final_accuracy']")).to_contain_text("0.8765")
    expect(summary.locator("tr[data-row='final_accuracy']")).to_contain_text("0.9012")
    epochs = page.locator("#compare-epochs")
    expect(epochs.locator("tr[data-epoch='1']")).to_contain_text("12.2 s")
    expect(epochs.locator("tr[data-epoch='1']")).to_contain_text("15.8 s")
    expect(epochs.locator("tr[data-epoch='2']")).to_contain_text("8.5 s")
    expect(epochs.locator("tr[data-epoch='2']")).to_contain_text("14.5 s")

    charts = page.locator("#charts figure.chart")
    expect(charts).to_have_count(2)  # loss and accuracy
    expect(charts.first.locator(".u-legend")).to_contain_text("digits-mw")
    expect(charts.first.locator(".u-legend")).to_contain_text("digits-ps")
    page.get_by_label("wall time (seconds since the job's first task started)").check()
    page.wait_for_function("() => window.tfdashCompare.axis === 'elapsed' && window.tfdashCompare.draws === 2")
    expect(charts.first.locator("figcaption")).to_have_text("loss per wall time")
    page.screenshot(path=str(artifacts_dir / "compare-1280.png"), full_page=True)

    # Narrow: nothing wider than the screen but the tables' own scrolling box.
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_function(
        "() => document.documentElement.scrollWidth <= window.innerWidth + 1"
        " && [...document.querySelectorAll('#charts .u-wrap')].every((w) => w.getBoundingClientRect().right <= 390)"
    )
    page.screenshot(path=str(artifacts_dir / "compare-390.png"), full_page=True)

    # Run again from the comparison: the form comes back filled in.
    page.get_by_label(f"Run job #{ps} again with another strategy").click()
    expect(page.locator("#id_name")).to_have_value("digits-ps (again)", timeout=WAIT_MS)
    expect(page.locator("#id_strategy")).to_have_value("parameter_server")
    assert errors == []
