"""Issue 13's acceptance, in a real browser: a new user with no script at hand signs in, picks a built-in digits
program in the New job form, sets MultiWorkerMirrored with 2 workers, Epochs 3, Per-replica batch 16 and Learning rate
0.01 with linear scaling (fields found by their label texts), launches on two real agents, watches the loss chart
grow, and the finished job's page shows what the runtime used: global batch 32 and learning rate 0.02.

Screenshots of the form and the finished job page at 1280 and 390 px go to $TFDASH_SCREENS (else the test
artifacts folder)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from orchestrator.models import Job
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_e2e import make_user, start_cluster, watch_errors
from tests.browser.test_job_live import sign_in, wait_live
from tests.support.processes import ManagedProcess

pytestmark = pytest.mark.django_db(transaction=True)

RUN_MS = 120_000
WAIT_MS = 15_000


def screens_dir(artifacts_dir: Path) -> Path:
    folder = Path(os.environ.get("TFDASH_SCREENS") or artifacts_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def no_sideways_scroll(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= innerWidth"))


def shoot(page: Any, path: Path) -> None:
    """Both widths, full page; at 390 px nothing may stick out sideways."""
    page.set_viewport_size({"width": 1280, "height": 900})
    page.screenshot(path=str(path.with_name(path.name + "-1280.png")), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    assert no_sideways_scroll(page), f"{path.name}: sideways scrolling at 390 px"
    page.screenshot(path=str(path.with_name(path.name + "-390.png")), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


def test_a_builtin_digits_job_from_the_form_trains_with_the_asked_hyperparameters_and_shows_what_it_used(
    orm: Orm,
    web: WebServer,
    browser: Any,
    orchestrator: ManagedProcess,
    start_agent: Callable[..., ManagedProcess],
    artifacts_dir: Path,
) -> None:
    screens = screens_dir(artifacts_dir)
    orm(make_user)
    start_cluster(orm, start_agent, ["form-node-0", "form-node-1"], first_port=31700)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = watch_errors(page)
    sign_in(page, web, "alice", "pw-alice-123", "/clusters/")
    expect(page.locator('tr[data-host^="form-node-"][data-status="online"]')).to_have_count(2, timeout=30_000)

    page.get_by_role("link", name="New job").click()
    page.wait_for_url(f"{web.url}/jobs/new/")
    # It opens valid, on the strategy that suits two online hosts, with nothing in error.
    expect(page.get_by_label("Strategy", exact=True)).to_have_value("multi_worker_mirrored")
    expect(page.locator("#calc-global")).not_to_have_attribute("data-value", "", timeout=WAIT_MS)
    expect(page.locator("#calc-problem")).to_be_hidden()
    expect(page.locator(".job-form .error >> visible=true")).to_have_count(0)

    # "My script" shows the upload and the hyperparameters as the environment variables a script reads; the
    # collapsed Resilience section opens from the keyboard.
    page.get_by_role("radio", name=re.compile(r"^My script")).check()
    expect(page.get_by_label("Upload a script")).to_be_visible()
    expect(page.locator("#script-env-note")).to_be_visible()
    expect(page.locator('[data-field="epochs"] .env-var')).to_have_text("a script reads it as TFDASH_EPOCHS")
    expect(page.get_by_label("Hang timeout (s)")).to_be_hidden()
    page.locator("#section-resilience > summary").focus()
    page.keyboard.press("Enter")
    expect(page.get_by_label("Hang timeout (s)")).to_be_visible()
    expect(page.get_by_label("Hang timeout (s)")).to_have_value("600")
    shoot(page, screens / "job-form-script")

    page.get_by_label("Name", exact=True).fill("digits from the form")
    page.get_by_role("radio", name=re.compile(r"^digits_mlp")).check()
    page.get_by_label("Strategy", exact=True).select_option("multi_worker_mirrored")
    page.get_by_label("Workers", exact=True).fill("2")
    page.get_by_label("Devices per worker", exact=True).fill("1")
    page.get_by_label("Epochs", exact=True).fill("3")
    page.get_by_label("Per-replica batch", exact=True).fill("16")
    page.get_by_label("Learning rate", exact=True).fill("0.01")
    page.get_by_label("LR scaling", exact=True).select_option("linear")
    page.get_by_label("Warm-up epochs", exact=True).fill("0")
    # The calculator follows the fields: 2 replicas in sync, 16 each.
    expect(page.locator("#calc-replicas")).to_have_attribute("data-value", "2", timeout=WAIT_MS)
    expect(page.locator("#calc-global")).to_have_attribute("data-value", "32", timeout=WAIT_MS)
    expect(page.locator("#calc-machine")).to_have_attribute("data-value", "16", timeout=WAIT_MS)
    expect(page.locator("#calc-rate")).to_have_attribute("data-value", "0.02", timeout=WAIT_MS)
    expect(page.locator("#calc-steps")).to_have_attribute("data-value", str(1438 // 32), timeout=WAIT_MS)
    # A built-in program needs no script: its upload and the variables' names are not shown.
    expect(page.get_by_label("Upload a script")).to_be_hidden()
    expect(page.locator("#script-env-note")).to_be_hidden()
    shoot(page, screens / "job-form")

    page.get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    job = orm(Job.objects.get, pk=job_id)
    assert (job.program_kind, job.builtin, job.strategy, job.workers) == (
        "builtin",
        "digits_mlp",
        "multi_worker_mirrored",
        2,
    )
    assert job.builtin_config["epochs"] == 3 and job.builtin_config["per_replica_batch"] == 16
    assert job.builtin_config["learning_rate"] == 0.01 and job.builtin_config["scale_lr"] == "linear"

    # The loss chart grows while it runs: read twice, the second read larger.
    wait_live(page, "tfdashLive.status === 'live'")
    page.wait_for_function("() => tfdashLive.chartPoints('loss') > 0", timeout=RUN_MS, polling=100)
    first = page.evaluate("tfdashLive.seriesPointCount('loss')")
    page.wait_for_function(f"() => tfdashLive.seriesPointCount('loss') > {first}", timeout=RUN_MS, polling=100)

    expect(page.locator("#job-state")).to_have_text("succeeded", timeout=RUN_MS)
    used = page.locator("#job-run-facts")
    expect(used.locator('tr[data-fact="global_batch"] td.used')).to_have_text("32", timeout=WAIT_MS)
    expect(used.locator('tr[data-fact="learning_rate"] td.used')).to_have_text("0.02")
    expect(used.locator('tr[data-fact="per_replica_batch"] td.asked')).to_have_text("16")
    expect(used.locator('tr[data-fact="per_device_batch"] td.used')).to_have_text("16")
    expect(used.locator('tr[data-fact="epochs"] td.used')).to_have_text("3")
    assert orm(lambda: Job.objects.get(pk=job_id).facts["global_batch"]) == 32
    shoot(page, screens / "job-finished")
    assert errors == [], errors
