"""The job page's host charts in a real browser, from history: a finished ParameterServer job shows CPU and memory
with one series per host that ran one of its tasks (and GPU charts for the host that has a GPU), however short the
job; a host that ran none of its tasks is not drawn. Its custom loop's steps/s get a chart of their own. Live host
samples are covered in test_job_live.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from orchestrator.models import HostSample, Job, MetricPoint, Task
from tests import factories
from tests.browser.conftest import Orm, WebServer
from tests.browser.test_job_live import host_sample, sign_in, wait_live

pytestmark = pytest.mark.django_db(transaction=True)

T0 = 1_790_000_000.0


def make_finished_ps_job() -> int:
    alice = get_user_model().objects.create_user("alice", password="pw-alice-123")
    a, _ = factories.host("node-a")
    b, _ = factories.host("node-b", port_min=24100)
    idle, _ = factories.host("node-idle", port_min=24200)
    job = Job.objects.create(
        owner=alice,
        cluster=a.cluster,
        name="ps",
        strategy="parameter_server",
        program_kind="script",
        workers=1,
        ps=1,
        attempt=1,
        state="succeeded",
    )

    def at(seconds: float) -> datetime:
        return datetime.fromtimestamp(T0 + seconds, tz=UTC)

    # A two-second job: shorter than the margin around it.
    chief = Task.objects.create(job=job, attempt=1, type="chief", index=0, host=a, state="succeeded",
                                started_at=at(0), finished_at=at(2))  # fmt: skip
    # What the injected hook reports for a ClusterCoordinator loop: steps/s and the loss, no examples/s.
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, task=chief, phase="train", name=name, step=step, value=value, ts=T0 + step / 50)
        for step in (20, 50, 80)
        for name, value in (("steps_per_s", 60.0), ("loss", 1.0 / step))
    )
    for kind in ("worker", "ps"):
        Task.objects.create(job=job, attempt=1, type=kind, index=0, host=b, state="killed", started_at=at(0.2),
                            finished_at=at(2.5))  # fmt: skip
    rows: list[HostSample] = []
    for host, gpus in ((a, 1), (b, 0), (idle, 0)):
        for i in range(-3, 6):
            sample: dict[str, Any] = host_sample(host.name, T0 + i, gpus=gpus)
            rows.append(
                HostSample(
                    host=host,
                    ts=sample["ts"],
                    cpu_percent=sample["cpu_percent"],
                    memory_used_mb=sample["memory_used_mb"],
                    memory_total_mb=sample["memory_total_mb"],
                    gpus=sample["gpus"],
                )
            )
    HostSample.objects.bulk_create(rows)
    return job.pk


def test_a_finished_jobs_page_draws_one_host_series_per_host_that_ran_a_task(
    orm: Orm, web: WebServer, browser: Any
) -> None:
    job = orm(make_finished_ps_job)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
    sign_in(page, web, "alice", "pw-alice-123", f"/jobs/{job}/")

    wait_live(page, "['cpu', 'mem', 'gpu_util', 'gpu_mem'].every((c) => tfdashLive.chartPoints(c) > 0)")

    assert page.evaluate("tfdashLive.chartSeries('cpu')") == ["time", "node-a", "node-b"]
    assert page.evaluate("tfdashLive.chartSeries('mem')") == ["time", "node-a", "node-b"]
    assert page.evaluate("tfdashLive.chartSeries('gpu_util')") == ["time", "node-a GPU 0"]
    # Every stored sample of the job's time on each host: from 3 s before to 5 s after (the window and margin).
    assert page.evaluate("tfdashLive.chartValues('cpu', 1).length") == 9
    assert page.evaluate("tfdashLive.chartValues('cpu', 2).length") == 9
    assert page.locator('figure[data-chart="cpu"] figcaption').inner_text() == "CPU % per host"
    # The custom loop's pace and loss; no Examples/s chart, so the Steps/s chart stands in for it.
    wait_live(page, "['loss', 'steps'].every((c) => tfdashLive.chartPoints(c) === 3)")
    assert page.evaluate("tfdashLive.chartSeries('steps')") == ["step", "chief 0"]
    assert page.evaluate("tfdashLive.chartValues('loss', 1)") == [1 / 20, 1 / 50, 1 / 80]
    assert page.locator('figure[data-chart="examples"]').count() == 0
    assert page.locator("#no-metrics").count() == 0
    assert not errors, errors
