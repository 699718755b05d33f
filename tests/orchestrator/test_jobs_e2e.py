"""Jobs end to end: real orchestrator, real agents, real TensorFlow processes talking gRPC on loopback.

The training scripts in tests/programs are plain tf.distribute programs that know nothing of this product.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from orchestrator.models import Host, HostPortBlock, HostStatus, Job, Task
from tests import factories
from tests.client.test_log_escapes import run_cli
from tests.support.processes import gone, wait_until
from tests.support.streaming import streamed

pytestmark = pytest.mark.django_db(transaction=True)

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
FINAL = ("succeeded", "failed", "cancelled", "timed_out")


@pytest.fixture
def cluster_of(orchestrator, start_agent):
    """Register N hosts (2 CPU device slots each, disjoint port ranges), start a real agent for each, wait online."""

    def make(n: int, *, first_port: int = 27000, cpu_slots: int = 2) -> list[Host]:
        hosts = []
        for i in range(n):
            host, token = factories.host(f"e2e-{i}", port_min=first_port + 10 * i)
            Host.objects.filter(pk=host.pk).update(port_max=first_port + 10 * i + 9, cpu_slots=cpu_slots)
            start_agent(host.name, token)
            hosts.append(host)
        wait_until(
            lambda: Host.objects.filter(status=HostStatus.ONLINE).count() == n, timeout=30, what=f"{n} hosts online"
        )
        return hosts

    return make


def submit(api: APIClient, script: str, **fields) -> int:
    data = {"name": script, "script": SimpleUploadedFile(script, (PROGRAMS / script).read_bytes()), **fields}
    response = api.post("/api/jobs/", data, format="multipart")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def wait_for_job(job_id: int, states: tuple[str, ...] = FINAL, timeout: float = 150) -> Job:
    return wait_until(
        lambda: (job := Job.objects.get(pk=job_id)).state in states and job,
        timeout,
        interval=0.25,
        what=f"job {job_id} to reach {states}",
    )


def log_text(task: Task) -> str:
    # Lines travel through the ingest, beside the task's exit: a test waits for the line it wants, never assumes it.
    return "\n".join(task.log_lines.order_by("seq").values_list("text", flat=True))


def assert_gone(pids: list[int], timeout: float) -> None:
    wait_until(
        lambda: all(gone(p) for p in pids),
        timeout,
        what=f"processes {pids} to be gone",
    )


def test_multi_worker_mirrored_trains_in_sync_on_two_hosts(api, cluster_of, open_tmp):
    cluster_of(2)
    out = open_tmp / "weights"
    out.mkdir(mode=0o1777)
    out.chmod(0o1777)  # the tasks, under their job's uid, write there
    job_id = submit(api, "mwms_fit.py", strategy="multi_worker_mirrored", workers=2, args=f"--epochs 3 --out {out}")

    job = wait_for_job(job_id)

    assert job.state == "succeeded", (job.reason, [log_text(t)[-2000:] for t in job.current_tasks()])
    # Worker 1 is left to finish by itself (not killed) once worker 0, the chief, is done.
    tasks = wait_until(
        lambda: (ts := list(job.current_tasks())) and all(t.exit_code is not None for t in ts) and ts,
        timeout=60,
        what="every worker to exit",
    )
    assert {t.host.name for t in tasks} == {"e2e-0", "e2e-1"}
    assert {(t.type, t.index) for t in tasks} == {("worker", 0), ("worker", 1)}
    assert [t.exit_code for t in tasks] == [0, 0]
    w0, w1 = np.load(out / "weights-worker-0.npz"), np.load(out / "weights-worker-1.npz")
    assert all(np.array_equal(w0[k], w1[k]) for k in w0.files)  # the all-reduce really kept them in sync
    # Its progress, kept at ingest from worker 0's points and the epochs and steps Keras told the injected callback
    # (2048 examples in global batches of 64: 32 steps an epoch): the last epoch of 3, nothing left.
    progress = wait_until(
        lambda: (p := Job.objects.get(pk=job_id).progress).get("epoch") == 3 and p, 30, what="progress at epoch 3"
    )
    assert (progress["epochs"], progress["step"], progress["steps"], progress["eta_s"]) == (3, 96, 96, 0.0), progress
    wait_until(lambda: "final loss" in log_text(tasks[0]), 30, what="the final loss line")
    assert_gone([t.pid for t in tasks], timeout=5)


def test_parameter_server_with_a_coordinator_succeeds_and_stops_its_servers(api, cluster_of):
    cluster_of(3)
    job_id = submit(api, "ps_coordinator.py", strategy="parameter_server", workers=2, ps=1, args="--steps 40")

    job = wait_for_job(job_id)

    assert job.state == "succeeded", job.reason
    tasks = {(t.type, t.index): t for t in job.current_tasks()}
    assert set(tasks) == {("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)}
    assert len({t.host_id for t in tasks.values()}) == 3
    assert tasks[("chief", 0)].exit_code == 0
    wait_until(lambda: "final loss" in log_text(tasks[("chief", 0)]), 30, what="the final loss line")
    # ps and workers never exit by themselves: the product stopped them once the chief was done.
    wait_until(
        lambda: all(t.state == "killed" for t in job.current_tasks().exclude(type="chief")),
        timeout=15,
        what="ps and workers stopped",
    )
    assert_gone([t.pid for t in tasks.values()], timeout=10)


def test_mirrored_gets_two_logical_devices_on_one_host(api, cluster_of, client, alice, monkeypatch):
    cluster_of(1)
    job_id = submit(
        api,
        "mirrored_fit.py",
        strategy="mirrored",
        workers=1,
        devices_per_worker=2,
        args="--expect-replicas 2 --verbose 1 --epochs 2",
    )

    job = wait_for_job(job_id)

    assert job.state == "succeeded", job.reason
    (task,) = job.current_tasks()
    assert task.tf_config is None and task.port is None  # one process needs no cluster
    assert task.devices == [0, 1]
    wait_until(lambda: "final loss" in log_text(task), 30, what="the final loss line")
    assert "replicas in sync 2" in log_text(task)
    # tf_keras drew its bar with \r and backspaces (stored so), and the job page, the task log page and the download
    # show each epoch's bar at its last state; ?raw=1 gives the redraws.
    assert "\x08" in log_text(task)
    client.force_login(alice)
    last_state = re.compile(r"^32/32 \[=+\] - \d+s \d+ms/step - loss: [\d.]+ - accuracy: [\d.]+$", re.MULTILINE)
    for page in (
        client.get(f"/jobs/{job_id}/").content.decode(),
        streamed(client.get(f"/jobs/{job_id}/tasks/{task.pk}/log/")).decode(),
        streamed(client.get(f"/api/jobs/{job_id}/logs/{task.pk}/?download=1")).decode(),
    ):
        assert "\x08" not in page and "\r" not in page
        assert len(last_state.findall(re.sub(r"</?span[^>]*>", "", page))) == 2  # one bar per epoch, at 32 of 32
    raw = streamed(client.get(f"/api/jobs/{job_id}/logs/{task.pk}/?download=1&raw=1")).decode()
    assert "\x08" in raw and "\r" in raw
    printed = run_cli(alice, monkeypatch, "logs", str(job_id), "--task", "worker:0")
    assert "\x08" not in printed and len(last_state.findall(printed)) == 2  # `tfdash logs` too
    assert "\x08" in run_cli(alice, monkeypatch, "logs", str(job_id), "--task", "worker:0", "--raw")


def test_a_job_larger_than_free_capacity_waits_then_runs(api, cluster_of):
    cluster_of(1)
    shape = {"strategy": "mirrored", "workers": 1, "devices_per_worker": 2, "args": "--epochs 2"}
    first = submit(api, "mirrored_fit.py", **shape)
    wait_for_job(first, ("starting", "running"), timeout=30)
    second = submit(api, "mirrored_fit.py", **shape)

    waiting = wait_until(
        lambda: (j := Job.objects.get(pk=second)).reason and j, timeout=10, what="a reason on the waiting job"
    )
    assert waiting.state == "queued"
    # The running job's time limit bounds the wait: the waiting one is told where and from when at the latest.
    assert waiting.reason.startswith("waiting for 2 device(s): reserved on e2e-0 from "), waiting.reason
    assert api.get(f"/api/jobs/{second}/").json()["reason"] == waiting.reason

    assert wait_for_job(first).state == "succeeded"
    done = wait_for_job(second)
    assert done.state == "succeeded", done.reason
    assert done.placed_at >= Job.objects.get(pk=first).finished_at


def test_cancel_during_training_kills_every_process(api, cluster_of):
    cluster_of(2)
    job_id = submit(
        api, "mwms_fit.py", strategy="multi_worker_mirrored", workers=2, args="--epochs 100 --epochs-sleep 1"
    )
    wait_for_job(job_id, ("running",), timeout=60)
    tasks = list(Job.objects.get(pk=job_id).current_tasks())
    wait_until(lambda: "Epoch 2/" in log_text(tasks[0]), timeout=60, what="training to be under way")
    pids = [t.pid for t in tasks]
    assert all(psutil.pid_exists(p) for p in pids)

    cancelled_at = time.monotonic()
    response = api.post(f"/api/jobs/{job_id}/cancel/")

    assert response.json()["state"] == "cancelled"
    assert_gone(pids, timeout=10)  # kill grace is 3 s
    assert time.monotonic() - cancelled_at < 10
    wait_until(
        lambda: all(t.state == "killed" for t in Task.objects.filter(job_id=job_id)), timeout=10, what="tasks killed"
    )


def test_a_script_that_raises_fails_the_job_with_task_exit_code_and_traceback(api, cluster_of, client, alice):
    cluster_of(1)
    job_id = submit(api, "raises.py", strategy="mirrored", workers=1, devices_per_worker=1)

    job = wait_for_job(job_id)

    assert job.state == "failed"
    assert job.reason == "worker 0 on e2e-0 exited with code 1"
    failure = wait_until(
        lambda: (f := api.get(f"/api/jobs/{job_id}/").json()["failure"]) and "RuntimeError" in f["log_tail"][-1] and f,
        timeout=10,
        what="the traceback tail in the API",
    )
    assert failure["task"] == "worker 0 on e2e-0"
    assert failure["exit_code"] == 1
    assert failure["log_tail"][-1] == "RuntimeError: the user's bug: bad shape in layer dense_1"
    verdict = wait_until(lambda: Job.objects.get(pk=job_id).diagnosis, timeout=10, what="the verdict")
    assert (verdict["kind"], verdict["task"], verdict["task_id"]) == (
        "user_exception",
        "worker 0 on e2e-0",
        failure["task_id"],
    )
    assert verdict["message"] == (
        "worker 0 on e2e-0 raised RuntimeError at raises.py:9: the user's bug: bad shape in layer dense_1"
    )
    client.force_login(alice)
    page = client.get(f"/jobs/{job_id}/").content.decode()
    assert "worker 0 on e2e-0 failed with exit code 1" in page
    assert "RuntimeError: the user&#x27;s bug: bad shape in layer dense_1" in page
    log = api.get(f"/api/jobs/{job_id}/logs/{failure['task_id']}/?download=1")
    assert "attachment" in log["Content-Disposition"]
    assert "Traceback (most recent call last)" in streamed(log).decode()


def test_a_taken_port_is_reported_and_the_task_gets_another(api, cluster_of):
    cluster_of(2, first_port=27100)
    squatter = socket.socket()
    # SO_REUSEADDR: an earlier test's TF connections on this port may linger in TIME_WAIT (60 s); a listening
    # squatter still takes the port from everyone else (the agent's check and TF alike).
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("0.0.0.0", 27100))  # the first port placement would pick on e2e-0
    squatter.listen()
    try:
        job_id = submit(api, "mwms_fit.py", strategy="multi_worker_mirrored", workers=2, args="--epochs 1")
        job = wait_for_job(job_id)
    finally:
        squatter.close()

    assert job.state == "succeeded", job.reason
    assert job.attempt == 2
    first = Task.objects.get(job=job, attempt=1, host__name="e2e-0")
    assert first.port == 27100
    assert "port 27100 was taken" in first.detail
    assert all(t.port != 27100 for t in job.current_tasks())
    assert HostPortBlock.objects.filter(host__name="e2e-0", port=27100).exists()


def test_a_job_that_never_connects_is_failed_at_its_startup_deadline(api, cluster_of, tmp_path):
    cluster_of(1)
    sleeper = tmp_path / "never_listens.py"
    sleeper.write_text("import time\nprint('waiting for a peer that never comes', flush=True)\ntime.sleep(600)\n")
    response = api.post(
        "/api/jobs/",
        {
            "name": "stuck",
            "strategy": "multi_worker_mirrored",
            "workers": 1,
            "startup_deadline_s": 10,
            "script": SimpleUploadedFile("never_listens.py", sleeper.read_bytes()),
        },
        format="multipart",
    )
    job_id = response.json()["id"]
    wait_until(lambda: Task.objects.filter(job_id=job_id, pid__isnull=False).exists(), 30, what="the task started")
    pid = Task.objects.get(job_id=job_id).pid

    job = wait_for_job(job_id, timeout=30)

    assert job.state == "failed"
    assert job.reason.startswith("not all tasks running and connected within 10 s: worker 0 on e2e-0 is started")
    verdict = wait_until(lambda: Job.objects.get(pk=job_id).diagnosis, timeout=10, what="the verdict")
    assert (verdict["kind"], verdict["task"]) == ("never_connected", "worker 0 on e2e-0"), verdict
    assert_gone([pid], timeout=10)


def test_a_host_that_goes_silent_loses_its_tasks_and_fails_the_job(api, cluster_of, orchestrator, start_agent):
    cluster_of(2)
    job_id = submit(
        api, "mwms_fit.py", strategy="multi_worker_mirrored", workers=2, args="--epochs 100 --epochs-sleep 1"
    )
    wait_for_job(job_id, ("running",), timeout=60)
    victim = Task.objects.get(job_id=job_id, index=1)
    agent = next(p for p in start_agent.started if p.name == f"agent-{victim.host.name}")  # type: ignore[attr-defined]

    agent.kill()  # the agent dies; its TF process (own session) is left to the reaper below

    job = wait_for_job(job_id, timeout=30)
    assert job.state == "failed"
    assert job.reason == f"host {victim.host.name} went offline; lost worker 1"
    assert Task.objects.get(pk=victim.pk).state == "lost"
    verdict = wait_until(lambda: Job.objects.get(pk=job_id).diagnosis, timeout=10, what="the verdict")
    assert (verdict["kind"], verdict["task"], verdict["task_id"]) == ("host_lost", victim.label, victim.pk), verdict
    assert all(peer["kind"] in ("peer_failure", "stopped") for peer in verdict["peers"]), verdict["peers"]
    # Its TF process outlived the agent (own session); reconciling on agent restart is the fault-tolerance work.
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(victim.pid).kill()
