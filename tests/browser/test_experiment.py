"""Issue 13's "Compare strategies" acceptance, for real: signed in, the New job form's Compare strategies section
(opened from the keyboard) starts an experiment of three variants of the built-in digits_mlp program (the 1-replica
baseline, Mirrored with 2 devices on one host, MultiWorkerMirrored 2 workers of 1 device), run one after another on two
real agents; once every run has ended its page shows the table, the curves and the verdict, and the API returns the
same numbers.

Screenshots of the experiment page at 1280 and 390 px go to $TFDASH_SCREENS (else the test artifacts folder)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from dashboard.experiment_page import COLUMNS
from orchestrator.experiments.actions import state_of
from orchestrator.models import Experiment, Job
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_e2e import make_user, start_cluster, watch_errors
from tests.browser.test_job_form_builtin import screens_dir
from tests.browser.test_job_live import sign_in
from tests.support.processes import ManagedProcess, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_MS = 15_000
VARIANTS = ("1-replica baseline", "Mirrored × 2 devices", "MultiWorkerMirrored 2 × 1")


def experiment_state(experiment_id: int) -> str:
    return state_of(Experiment.objects.get(pk=experiment_id))


def test_a_three_variant_experiment_from_the_form_finishes_and_its_page_and_api_agree(
    orm: Orm,
    web: WebServer,
    browser: Any,
    orchestrator: ManagedProcess,
    start_agent: Callable[..., ManagedProcess],
    artifacts_dir: Path,
) -> None:
    orm(make_user)
    start_cluster(orm, start_agent, ["exp-node-0", "exp-node-1"], first_port=31900)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = watch_errors(page)
    sign_in(page, web, "alice", "pw-alice-123", "/clusters/")
    expect(page.locator('tr[data-host^="exp-node-"][data-status="online"]')).to_have_count(2, timeout=30_000)

    page.goto(f"{web.url}/jobs/new/")
    page.get_by_label("Name", exact=True).fill("digits: which strategy")
    page.get_by_role("radio", name=re.compile(r"^digits_mlp")).check()
    page.get_by_label("Epochs", exact=True).fill("2")
    page.get_by_label("Per-replica batch", exact=True).fill("32")
    # The section is collapsed; it opens from the keyboard.
    expect(page.get_by_label("Target accuracy")).to_be_hidden()
    page.locator("#section-compare > summary").focus()
    page.keyboard.press("Enter")
    expect(page.get_by_label("Target accuracy")).to_be_visible()
    expect(page.get_by_label("Target accuracy")).to_have_value("0.9")
    expect(page.get_by_role("radio", name="one after another")).to_be_checked()
    for label in VARIANTS:
        page.get_by_role("checkbox", name=label).check()
    expect(page.get_by_role("checkbox", name="ParameterServer 2 × 1 + 1 ps")).not_to_be_checked()
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth"), "the form scrolls sideways at 390 px"
    page.locator("#section-compare").screenshot(path=str(screens_dir(artifacts_dir) / "experiment-form-390.png"))
    page.set_viewport_size({"width": 1280, "height": 900})

    page.get_by_role("button", name="Compare strategies").click()
    page.wait_for_url(re.compile(r"/experiments/\d+/$"))
    experiment_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    expect(page.locator("#experiment-summary tbody tr")).to_have_count(3)

    wait_until(
        lambda: orm(experiment_state, experiment_id) not in ("queued", "running"),
        timeout=400,
        interval=1,
        what=f"experiment {experiment_id} to end",
    )
    jobs = orm(lambda: list(Job.objects.filter(experiment_id=experiment_id).order_by("pk")))
    assert [j.variant for j in jobs] == list(VARIANTS)  # one after another, in the chosen order
    assert [j.state for j in jobs] == ["succeeded"] * 3, [(j.variant, j.reason) for j in jobs]
    # One after another: each run was placed only after the previous one had ended.
    assert all(b.placed_at is not None and a.finished_at is not None and b.placed_at >= a.finished_at
               for a, b in itertools.pairwise(jobs))  # fmt: skip

    page.reload()
    expect(page.locator("#experiment-state")).to_have_attribute("data-state", "succeeded")
    verdict = page.locator("#verdict").inner_text()
    assert "Still running" not in verdict and "Scaling efficiency against the 1-replica baseline" in verdict
    assert re.search(r"was the fastest to 90% accuracy|No variant reached the target|a tie on this cluster", verdict)
    # The curves: one uPlot chart per metric, each with the three runs' series.
    expect(page.locator("#charts .uplot")).not_to_have_count(0, timeout=WAIT_MS)
    data = page.evaluate("JSON.parse(document.getElementById('compare-data').textContent)")
    assert {"loss", "accuracy"} <= set(data["metrics"])
    assert [len(run["epoch"]) for run in data["jobs"]] == [2, 2, 2]

    # The API returns the same numbers the page shows.
    api = page.request.get(f"{web.url}/api/experiments/{experiment_id}/").json()
    assert api["state"] == "succeeded"
    assert api["summary"]["verdict"] == verdict
    assert api["summary"]["charts"] == data
    for variant in api["summary"]["variants"]:
        row = page.locator(f'#experiment-summary tr[data-variant="{variant["label"]}"]')
        for column in COLUMNS:
            value = variant[column.key]
            cell = row.locator(f'td[data-key="{column.key}"]')
            if value is None:
                expected = {"time_to_target_s": "not reached", "scaling_efficiency": "baseline"}.get(column.key, "—")
                expect(cell).to_have_text(re.compile("^" + re.escape(expected)))
            else:
                expect(cell).to_contain_text(column.fmt(value))
        assert variant["examples_per_s"] and variant["mean_epoch_s"] and variant["final_loss"] is not None
    baseline, mirrored, mwms = api["summary"]["variants"]
    assert baseline["scaling_efficiency"] is None and baseline["replicas"] == 1
    assert mirrored["scaling_efficiency"] == pytest.approx(
        mirrored["examples_per_s"] / (2 * baseline["examples_per_s"])
    )
    assert mwms["replicas"] == 2 and mwms["scaling_efficiency"] is not None

    shoot_with_charts(page, screens_dir(artifacts_dir) / "experiment")
    assert errors == [], errors


def shoot_with_charts(page: Any, path: Path) -> None:
    """Both widths, full page, each once the charts have followed the new width (compare.js counts its resizes); at
    390 px nothing may stick out sideways."""
    page.set_viewport_size({"width": 1280, "height": 900})
    page.screenshot(path=str(path.with_name(path.name + "-1280.png")), full_page=True)
    before = page.evaluate("tfdashCompare.resizes")
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_function(f"() => tfdashCompare.resizes > {before}", timeout=WAIT_MS)
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth"), "sideways scrolling at 390 px"
    assert page.evaluate(
        "[...document.querySelectorAll('#charts .uplot')].every(c => c.getBoundingClientRect().right <= innerWidth)"
    ), "a chart is cut off at 390 px"
    page.screenshot(path=str(path.with_name(path.name + "-390.png")), full_page=True)
