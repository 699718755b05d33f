"""Issue 24's small ones, in the real browser: a job page loaded while running drops "Cancel job" when the job ends and
its ps/workers read "stopped with the job"; the jobs list shows progress (epoch k of n, live), duration, a failure's
reason and a search by name; experiments have a list page in the navigation; the job page offers the TensorBoard
export. No CSP violation on any of them. Screenshots at 1280 and 390 px go to $TFDASH_SCREENS (else test artifacts)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from playwright.sync_api import expect

from orchestrator.metrics import live
from orchestrator.models import Job, Task
from tests import factories
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_e2e import watch_errors
from tests.browser.test_job_form_builtin import screens_dir
from tests.browser.test_job_live import sign_in

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_MS = 15_000


def setup() -> dict[str, int]:
    alice = get_user_model().objects.create_user("alice", password="pw-alice-123")
    cluster = factories.cluster()
    started = timezone.now() - timedelta(seconds=90)
    running = Job.objects.create(
        owner=alice, cluster=cluster, name="ps-training", strategy="parameter_server", program_kind="builtin",
        builtin="digits_mlp", builtin_config={"epochs": 5}, workers=1, ps=1, state="running", attempt=1,
        started_at=started,
    )  # fmt: skip
    tasks = [
        Task.objects.create(job=running, attempt=1, type=kind, index=0, state="running", started_at=started)
        for kind in ("chief", "worker", "ps")
    ]
    # What the ingest keeps from the chief's points (orchestrator/metrics/progress.py): no ETA before an epoch ended.
    Job.objects.filter(pk=running.pk).update(progress=progress(epoch=2, eta_s=None))
    Job.objects.create(
        owner=alice, cluster=cluster, name="broken-run", strategy="mirrored", program_kind="script", state="failed",
        reason="worker 0 exited 1: ValueError: bad shape", started_at=started,
        finished_at=started + timedelta(seconds=12),
    )  # fmt: skip
    return {"job": running.pk, "chief": tasks[0].pk}


def end_job(job_id: int) -> None:
    with transaction.atomic():
        Job.objects.filter(pk=job_id).update(state="succeeded", reason="chief 0 exited 0", finished_at=timezone.now())
        Task.objects.filter(job_id=job_id, type="chief").update(state="succeeded", exit_code=0)
        Task.objects.filter(job_id=job_id).exclude(type="chief").update(
            state="killed", exit_code=-15, detail="the coordinator finished"
        )
        live.job_changed(job_id)


def progress(epoch: int, eta_s: float | None) -> dict[str, Any]:
    return {"epoch": epoch, "epochs": 5, "step": 10 * epoch, "steps": 50, "examples_per_s": 640.0, "eta_s": eta_s,
            "resumed_from_epoch": 0, "at": time.time()}  # fmt: skip


def progress_frame(job_id: int) -> None:
    text = "epoch 4/5 · step 40/50 · 640 examples/s · ETA 1 min"
    live.publish(job_id, {"type": "progress", "progress": progress(epoch=4, eta_s=60.0), "text": text})


def next_epoch(ids: dict[str, int]) -> None:
    Job.objects.filter(pk=ids["job"]).update(progress=progress(epoch=3, eta_s=150.0))


def shoot(page: Any, folder: Path, name: str) -> None:
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=str(folder / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


def test_jobs_list_job_page_and_experiments_in_the_browser(orm: Orm, web: WebServer, browser: Any, artifacts_dir):
    ids = orm(setup)
    folder = screens_dir(artifacts_dir)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = watch_errors(page)
    sign_in(page, web, "alice", "pw-alice-123", "/jobs/")

    # The jobs list: progress, duration, the failure's reason; live while a job runs.
    row = page.locator(f"tr[data-job='{ids['job']}']")
    expect(row.locator("td.progress")).to_have_text("epoch 2/5", timeout=WAIT_MS)
    expect(row.locator("td.duration")).to_contain_text(" s")
    failed = page.locator("tr[data-state='failed']")
    expect(failed.locator(".failure-reason")).to_have_text("worker 0 exited 1: ValueError: bad shape")
    shoot(page, folder, "jobs-list")
    orm(next_epoch, ids)
    expect(row.locator("td.progress")).to_have_text("epoch 3/5 · ETA 2 min", timeout=WAIT_MS)  # no reload
    page.fill("#filter-name", "broken")
    page.click("#job-filters button[type=submit]")
    expect(page.locator("tbody#job-rows tr[data-job]")).to_have_count(1)
    expect(page.locator("tbody#job-rows tr[data-job]")).to_have_attribute("data-state", "failed")

    # Experiments: in the navigation, with a list page.
    page.click("header nav >> text=Experiments")
    expect(page.locator("h1")).to_have_text("Experiments")
    expect(page.locator("#experiments")).to_contain_text("No experiments yet.")

    # The job page, loaded while running: "Cancel job" goes when the job ends; its ps and worker were stopped with it.
    page.goto(f"{web.url}/jobs/{ids['job']}/")
    page.wait_for_function("() => window.tfdashLive && window.tfdashLive.jobFrames > 0", timeout=WAIT_MS)
    expect(page.locator("#cancel-job")).to_be_visible()
    expect(page.locator("#job-progress")).to_contain_text("epoch 3/5 · step 30/50 · 640 examples/s · ETA ")
    orm(progress_frame, ids["job"])  # as the ingest sends it after a batch (orchestrator/metrics/progress.py)
    expect(page.locator("#job-progress")).to_have_text("epoch 4/5 · step 40/50 · 640 examples/s · ETA 1 min")
    expect(page.locator("#tensorboard-export")).to_have_attribute("href", f"/api/jobs/{ids['job']}/tensorboard/")
    orm(end_job, ids["job"])
    expect(page.locator("#cancel-job")).to_be_hidden(timeout=WAIT_MS)
    expect(page.locator("#job-progress")).to_have_text("epoch 3/5 · step 30/50 · 640 examples/s")  # no ETA once ended
    for kind in ("worker", "ps"):
        cell = page.locator(f"tr[data-task='{kind}-0'] [data-stopped-with-job]")
        expect(cell).to_have_text("stopped with the job")
    expect(page.locator("#job-live")).not_to_contain_text("-15")
    shoot(page, folder, "job-ended")
    assert errors == []
