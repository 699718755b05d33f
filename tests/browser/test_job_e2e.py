"""The whole product in a real browser: a user signs in, creates a MultiWorkerMirrored job through the New job form
(an uploaded tf.keras script, two workers on two real agents), watches the loss chart grow while it trains, and sees
the job succeed, with its facts and each task's log tail. Then the derived series and the straggler flag, fed
points through the live channel as the ingest publishes them."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from orchestrator.metrics import live
from orchestrator.models import Host, Job, MetricPoint, Task
from tests import factories
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_live import sign_in, wait_live
from tests.support.processes import ManagedProcess

pytestmark = pytest.mark.django_db(transaction=True)

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
RUN_MS = 90_000


def register_hosts(names: list[str], first_port: int) -> list[tuple[str, str]]:
    """Hosts with 2 CPU device slots and disjoint port ranges; (name, agent token) of each."""
    registered = []
    for i, name in enumerate(names):
        host, token = factories.host(name, port_min=first_port + 10 * i)
        Host.objects.filter(pk=host.pk).update(port_max=first_port + 10 * i + 9, cpu_slots=2)
        registered.append((name, token))
    return registered


def make_user(*, staff: bool = False) -> None:
    get_user_model().objects.create_user("alice", password="pw-alice-123", is_staff=staff)


def start_cluster(
    orm: Orm, start_agent: Callable[..., ManagedProcess], names: list[str], first_port: int
) -> list[tuple[str, str]]:
    hosts = orm(register_hosts, names, first_port)
    for name, token in hosts:
        start_agent(name, token)
    return hosts


def watch_errors(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
    return errors


def test_a_job_made_with_the_form_trains_on_real_agents_with_live_charts_and_succeeds(
    orm: Orm, web: WebServer, browser: Any, orchestrator: ManagedProcess, start_agent: Any, artifacts_dir: Path
) -> None:
    orm(make_user)
    start_cluster(orm, start_agent, ["e2e-page-0", "e2e-page-1"], first_port=29400)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = watch_errors(page)
    sign_in(page, web, "alice", "pw-alice-123", "/clusters/")
    # The agents' first heartbeats: the cluster page (refreshed by htmx) shows both hosts online.
    expect(page.locator('tr[data-host^="e2e-page-"][data-status="online"]')).to_have_count(2, timeout=30_000)

    page.goto(f"{web.url}/jobs/new/")
    page.fill("#id_name", "form mwms")
    page.select_option("#id_strategy", "multi_worker_mirrored")
    page.get_by_role("radio", name=re.compile(r"^My script")).check()
    page.set_input_files("#id_script", str(PROGRAMS / "mwms_fit.py"))
    # One train point per epoch and worker (an epoch is shorter than the 0.5 s metric window); the sleep keeps the
    # job running for a few seconds of charts.
    page.fill("#id_args", "--epochs 10 --epochs-sleep 0.6")
    page.fill("#id_workers", "2")
    expect(page.locator("#id_ps")).to_have_value("0")  # read-only under MultiWorkerMirrored
    page.fill("#id_devices_per_worker", "1")
    expect(page.locator("#id_legacy_keras")).to_be_checked()  # tf.keras model.fit needs legacy Keras under MWMS
    page.get_by_role("button", name="Launch", exact=True).click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    expect(page.locator("h1")).to_contain_text("form mwms")

    # The loss chart's data grows while the job runs: read twice, the second read larger, the job still running.
    wait_live(page, "tfdashLive.status === 'live'")
    page.wait_for_function("() => tfdashLive.chartPoints('loss') > 0", timeout=RUN_MS, polling=100)
    first = page.evaluate("tfdashLive.seriesPointCount('loss')")
    page.wait_for_function(
        f"() => tfdashLive.seriesPointCount('loss') > {first} && tfdashLive.chartPoints('loss') > 1",
        timeout=RUN_MS,
        polling=100,
    )
    second = page.evaluate("tfdashLive.seriesPointCount('loss')")
    assert second > first
    running = page.locator("#job-state").inner_text()
    assert running in ("starting", "running", "succeeded"), running

    expect(page.locator("#job-state")).to_have_text("succeeded", timeout=RUN_MS)
    # Both workers on the charts, with the derived series.
    page.wait_for_function(
        "() => tfdashLive.chartSeries('loss').includes('overall (mean)')"
        " && tfdashLive.chartSeries('examples').includes('total')",
        timeout=15_000,
    )
    assert page.evaluate("tfdashLive.chartSeries('loss')") == ["step", "worker 0", "worker 1", "overall (mean)"]
    expect(page.locator("tr[data-task] .state-succeeded")).to_have_count(2)
    expect(page.locator("#job-key-facts")).to_contain_text("MultiWorkerMirroredStrategy")
    # Facts reported by the injected callback (tf.keras model.fit in the user's script) reach the panel.
    expect(page.locator("#job-key-facts")).to_contain_text("Replicas in sync", timeout=15_000)

    # The log tail: each task's last lines, switched with the keyboard.
    worker1 = page.locator(".log-tabs button", has_text="worker 1")
    expect(worker1).to_be_visible(timeout=15_000)
    worker1.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#log-tail")).to_contain_text("final loss", timeout=15_000)
    expect(page.locator("#log-tail .log-tail-head")).to_contain_text("worker 1")
    expect(worker1).to_have_attribute("aria-pressed", "true")
    download = page.locator("#log-tail a[download]")
    assert download.get_attribute("href").startswith(f"/api/jobs/{job_id}/logs/")

    assert orm(lambda: Job.objects.get(pk=job_id).state) == "succeeded"
    page.screenshot(path=str(artifacts_dir / "job-e2e-1280.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_function(
        "() => [...document.querySelectorAll('.chart .uplot')].every((u) => u.offsetWidth <= innerWidth)"
    )
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth"), "no sideways scrolling when narrow"
    page.screenshot(path=str(artifacts_dir / "job-e2e-390.png"), full_page=True)
    assert errors == []


# --- the derived series and the straggler flag, from points published as the ingest does ---------------------------


def make_running_job() -> dict[str, Any]:
    make_user()
    host, _ = factories.host("pace-node")
    job = Job.objects.create(
        owner=get_user_model().objects.get(username="alice"),
        cluster=host.cluster,
        name="pace",
        strategy="parameter_server",
        program_kind="script",
        workers=3,
        attempt=1,
        state="running",
    )
    tasks = [
        Task.objects.create(job=job, attempt=1, type="worker", index=i, host=host, state="running") for i in range(3)
    ]
    return {"job": job.pk, "tasks": [t.pk for t in tasks]}


def store_points(job_id: int, rows: list[tuple[int, str, int, float]]) -> list[list[Any]]:
    """(task, name, step, value) as stored train points; returned as frame rows in id order."""
    stored = MetricPoint.objects.bulk_create(
        MetricPoint(job_id=job_id, task_id=t, phase="train", name=n, step=s, epoch=1, value=v, ts=1.7e9 + s)
        for t, n, s, v in rows
    )
    return sorted([[p.pk, p.task_id, p.phase, p.name, p.step, p.epoch, p.value, p.ts] for p in stored])


def publish(job_id: int, points: list[list[Any]]) -> None:
    live.publish(job_id, {"type": "metrics", "points": points, "cursor": max(p[0] for p in points)})


def test_a_worker_whose_step_time_stays_high_is_flagged_live_and_the_overall_series_are_drawn(
    orm: Orm, web: WebServer, browser: Any
) -> None:
    scene = orm(make_running_job)
    job, (w0, w1, w2) = scene["job"], scene["tasks"]
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = watch_errors(page)
    sign_in(page, web, "alice", "pw-alice-123", f"/jobs/{job}/")
    wait_live(page, "tfdashLive.status === 'live'")

    # Steps that do not coincide across tasks: the overall loss holds each task's latest value.
    rows = [(w0, "loss", s, 1.0) for s in range(2, 21, 2)] + [(w1, "loss", s, 3.0) for s in range(1, 20, 2)]
    rows += [(t, "examples_per_s", s, 100.0) for t in (w0, w1, w2) for s in range(1, 11)]
    # Ten points each: worker 2 at 0.3 s a step against 0.1 s; one slow step of worker 0 flags nothing.
    rows += [(w0, "step_time_s", s, 0.9 if s == 1 else 0.1) for s in range(1, 11)]
    rows += [(w1, "step_time_s", s, 0.1) for s in range(1, 11)]
    rows += [(w2, "step_time_s", s, 0.3) for s in range(1, 11)]
    publish(job, orm(store_points, job, rows))

    wait_live(page, "tfdashLive.stragglers.length === 1")
    assert [s["task"] for s in page.evaluate("tfdashLive.stragglers")] == [w2]
    expect(page.locator(f'tr[data-task-id="{w2}"]')).to_have_class(re.compile(r"\bstraggler\b"))
    expect(page.locator(f'tr[data-task-id="{w2}"] td.pace')).to_have_text("straggler · 3.0×")
    expect(page.locator(f'tr[data-task-id="{w0}"] td.pace')).to_have_text("0.50×")
    expect(page.locator("#stragglers")).to_contain_text("worker 2")
    # The flag survives the task table's refresh (a `job` frame after a task's change).
    frames = page.evaluate("tfdashLive.jobFrames")
    orm(lambda: Task.objects.get(pk=w0).save())
    wait_live(page, f"tfdashLive.jobFrames > {frames}")
    expect(page.locator(f'tr[data-task-id="{w2}"] td.pace')).to_have_text("straggler · 3.0×")

    wait_live(page, "tfdashLive.chartSeries('loss').includes('overall (mean)')")
    overall = page.evaluate("tfdashLive.chartValues('loss', 3)")
    # Step 1: worker 1 alone (3.0); from step 2 on both (mean 2.0); at step 20 worker 1 has stopped reporting.
    assert overall[0] == 3.0 and set(overall[1:-1]) == {2.0} and overall[-1] == 1.0, overall
    wait_live(page, "tfdashLive.chartSeries('examples').includes('total')")
    assert set(page.evaluate("tfdashLive.chartValues('examples', 4)")) == {300.0}

    # Worker 2 catches up: its recent window (the last 20 points) turns fast, the flag goes.
    publish(job, orm(store_points, job, [(t, "step_time_s", s, 0.1) for t in (w0, w1, w2) for s in range(11, 31)]))
    wait_live(page, "tfdashLive.stragglers.length === 0")
    expect(page.locator("#stragglers")).to_be_hidden()
    expect(page.locator(f'tr[data-task-id="{w2}"]')).not_to_have_class(re.compile(r"\bstraggler\b"))
    assert errors == []
