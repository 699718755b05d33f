"""Issue 13, end to end with real agents and real TensorFlow on loopback: the seeds' ParameterServer coordinator
program (tests/programs/ps_coordinator.py, unmodified) reports steps/s and its loss live through the injected hook,
and the pages of a ParameterServer job and of a ~10 s MultiWorkerMirrored job carry one host series for every host
that ran one of their tasks, live while they run and from history after."""

from __future__ import annotations

import math
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from rest_framework.test import APIClient

from orchestrator.metrics import hosts
from orchestrator.models import HostSample, Job
from tests.dashboard.test_job_socket import connect, read_history
from tests.orchestrator.test_jobs_e2e import cluster_of, submit, wait_for_job  # noqa: F401 - cluster_of: a fixture
from tests.support.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True)]

COLUMNS = ["seq", "task", "phase", "name", "step", "epoch", "value", "ts"]


def hosts_that_ran(job_id: int) -> set[str]:
    job = Job.objects.get(pk=job_id)
    return {t.host.name for t in job.tasks.select_related("host") if t.started_at is not None and t.host}


def by_host(samples: list[dict[str, Any]]) -> dict[str, list[float]]:
    series: dict[str, list[float]] = {}
    for sample in samples:
        series.setdefault(sample["host"], []).append(sample["ts"])
    return series


def framed(windows: list[dict[str, Any]], samples: list[dict[str, Any]]) -> bool:
    """Every host's window is closed and its samples reach from before its first task started (the margin is
    WINDOW_MARGIN_S) to after its last one ended."""
    series = by_host(samples)
    return bool(windows) and all(
        w["end"] is not None
        and w["host"] in series
        and series[w["host"]][0] <= w["start"] + hosts.WINDOW_MARGIN_S
        and series[w["host"]][-1] >= w["end"] - hosts.WINDOW_MARGIN_S
        for w in windows
    )


def sampled_cluster(make_cluster: Any, n: int, **kwargs: Any) -> None:
    """N hosts online that have sent a sample already: as hosts that did not come up a moment ago, so a sample
    before the job's first task is there to frame it (an agent's first sample comes one interval after its start)."""
    names = {h.name for h in make_cluster(n, **kwargs)}
    wait_until(
        lambda: set(HostSample.objects.filter(host__name__in=names).values_list("host__name", flat=True)) == names,
        30,
        what="a first sample from every host",
    )


def wait_framed(job_id: int) -> None:
    """Until every task has ended and the agents sampled past the end (they sample every second)."""

    def done() -> bool:
        windows, samples = hosts.job_samples(job_id)
        return framed([w.as_dict() for w in windows], samples)

    try:
        wait_until(done, 60, interval=0.5, what=f"job {job_id}'s host samples to reach past its tasks' end")
    except AssertionError:
        windows, samples = hosts.job_samples(job_id)
        spans = {name: (stamps[0], stamps[-1], len(stamps)) for name, stamps in by_host(samples).items()}
        found = [w.as_dict() for w in windows]
        raise AssertionError(f"windows {found}, samples (first, last, count) {spans}") from None


@pytest.mark.asyncio
async def test_a_parameter_server_custom_loop_shows_live_steps_per_s_and_loss_and_every_hosts_load(alice, cluster_of):  # noqa: F811
    api = APIClient()
    api.force_authenticate(alice)

    def launch() -> int:
        sampled_cluster(cluster_of, 3)
        # Steps enough to outlast the test's reading: the job is cancelled once everything was seen live.
        return submit(
            api,
            "ps_coordinator.py",
            strategy="parameter_server",
            workers=2,
            ps=1,
            args="--steps 999999 --log-every 50",
        )

    job_id = await sync_to_async(launch)()
    socket, connected, _ = await connect(alice, job_id)
    assert connected
    await read_history(socket)

    # Live frames, as the page gets them, until steps/s and loss points and samples of every host that ran a task.
    live: dict[str, list[list[Any]]] = {}
    live_hosts: dict[str, int] = {}
    ran: set[str] = set()
    while not (
        {"steps_per_s", "loss"} <= set(live) and len(live["steps_per_s"]) >= 2 and ran and ran <= set(live_hosts)
    ):
        frame = await socket.receive_json_from(timeout=240)
        if frame["type"] == "metrics":
            assert frame["history"] is False
            for point in frame["points"]:
                live.setdefault(point[3], []).append(point)
        elif frame["type"] == "hosts":
            for sample in frame["samples"]:
                live_hosts[sample["host"]] = live_hosts.get(sample["host"], 0) + 1
        ran = await sync_to_async(hosts_that_ran)(job_id)
    job = await sync_to_async(Job.objects.get)(pk=job_id)
    assert job.state == "running", "the points were to arrive while the job runs"
    await socket.disconnect()

    chief = await sync_to_async(lambda: job.tasks.get(type="chief").pk)()
    # Only the coordinator counts steps; the servers send only how busy their processes are (the slow worker's notes).
    assert {p[1] for name, points in live.items() if name != "process_cpu_percent" for p in points} == {chief}
    steps = [p[4] for p in live["steps_per_s"]]
    assert steps == sorted(steps) and steps[0] > 0
    assert all(p[6] > 0 for p in live["steps_per_s"])
    assert all(math.isfinite(p[6]) and p[6] > 0 for p in live["loss"])  # a softmax cross-entropy
    assert len(ran) == 3  # chief, 2 workers and a ps over three hosts

    cancelled = await sync_to_async(api.post)(f"/api/jobs/{job_id}/cancel/")
    assert cancelled.status_code == 200, cancelled.content
    await sync_to_async(wait_for_job)(job_id)
    await sync_to_async(wait_framed)(job_id)

    # After the job: the page's history has the same series and every host's load over the job's time.
    socket, connected, _ = await connect(alice, job_id)
    assert connected
    history, _end = await read_history(socket)
    host_frame = await socket.receive_json_from(timeout=10)
    await socket.disconnect()
    assert {"steps_per_s", "loss"} <= {p[3] for p in history}
    assert host_frame["type"] == "hosts" and host_frame["history"] is True
    assert {w["host"] for w in host_frame["windows"]} == set(by_host(host_frame["samples"])) == ran
    assert framed(host_frame["windows"], host_frame["samples"])
    assert all(stamps == sorted(stamps) for stamps in by_host(host_frame["samples"]).values())


def test_a_ten_second_multi_worker_job_has_a_host_series_for_each_of_its_hosts(api, cluster_of):  # noqa: F811
    sampled_cluster(cluster_of, 2, first_port=27100)
    # Three short epochs and 3 s of sleep after each: about ten seconds of training.
    job_id = submit(api, "mwms_fit.py", strategy="multi_worker_mirrored", workers=2, args="--epochs 3 --epochs-sleep 3")

    job = wait_for_job(job_id)

    assert job.state == "succeeded", job.reason
    ran = hosts_that_ran(job_id)
    assert ran == {"e2e-0", "e2e-1"}
    wait_framed(job_id)  # worker 1 may still be finishing when the job has succeeded
    body = api.get(f"/api/jobs/{job_id}/hosts/").json()
    assert {w["host"] for w in body["windows"]} == set(by_host(body["samples"])) == ran
    assert framed(body["windows"], body["samples"])
    sample = body["samples"][0]
    assert sample["cpu_percent"] is not None and sample["memory_used_mb"] > 0
