"""Orders lost on the way to an agent are made good by the heartbeat's convergence (orchestrator/agents/reconcile.py):
a real orchestrator, a real agent and real task processes; the test process drops the order on purpose by
placing or cancelling the job itself with its own sends of that order discarded."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

from contracts.protocol import AGENT_KILL
from orchestrator.jobs import dispatch, lifecycle
from orchestrator.models import Host, HostStatus, Job, JobState, Task, TaskState
from orchestrator.scheduler import scheduling
from orchestrator.submit import submission
from tests import factories
from tests.support.processes import gone, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ONCE = b"print('ran once', flush=True)\n"
# Serves on the port its TF_CONFIG gives it, as a ParameterServer task does, until it is killed.
SERVER = b"""
import json, os, socket, time
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
port = int(config["cluster"][task["type"]][task["index"]].rsplit(":", 1)[1])
server = socket.socket()
server.bind(("127.0.0.1", port))
server.listen()
print("serving on", port, flush=True)
while True:
    time.sleep(60)
"""


@contextlib.contextmanager
def dropping(order: str) -> Iterator[list[Any]]:
    """Orders of kind `order` that this process sends are lost (stamped as sent, never queued)."""
    dropped: list[Any] = []
    original = dispatch.app.send_task

    def send_task(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == order:
            dropped.append(kwargs.get("args"))
            return None
        return original(name, *args, **kwargs)

    dispatch.app.send_task = send_task  # type: ignore[method-assign]
    try:
        yield dropped
    finally:
        dispatch.app.send_task = original  # type: ignore[method-assign]


@pytest.fixture
def online_host(orchestrator, start_agent):  # type: ignore[no-untyped-def]
    host, token = factories.host("conv-0", port_min=27400)
    Host.objects.filter(pk=host.pk).update(port_max=27409, cpu_slots=4)
    agent = start_agent(host.name, token)
    wait_until(lambda: Host.objects.get(pk=host.pk).status == HostStatus.ONLINE, timeout=30, what="the host online")
    return host, agent


def placed_now(owner: Any, host: Host, script: bytes, **shape: Any) -> Job:
    """Submit and place a job in one transaction (so no other scheduler pass can place it first)."""
    upload = submission.Upload(filename="job.py", content=script)
    with transaction.atomic():
        job, _ = submission.new_job(owner, host.cluster, {"name": "convergence", **shape})
        submission.submit(job, upload)
        assert scheduling.schedule_cluster(host.cluster_id) == [job.pk]
    return job


def final(job: Job, timeout: float = 60) -> Job:
    return wait_until(lambda: (j := Job.objects.get(pk=job.pk)).is_terminal and j, timeout, what="the job to end")


def test_a_lost_launch_order_is_sent_again_and_runs_once(online_host, alice, orchestrator):
    host, _agent = online_host

    # A pass hands its launch orders to the scheduler's worker to send (dispatch.LAUNCH): that message lost is the
    # launch order lost (the task stamped as ordered, nothing sent to the agent).
    with dropping(dispatch.LAUNCH) as dropped:
        job = placed_now(alice, host, ONCE, strategy="mirrored", workers=1, devices_per_worker=1)
    assert len(dropped) == 1

    job = final(job)
    assert job.state == JobState.SUCCEEDED, job.reason
    task = Task.objects.get(job=job)
    assert task.state == TaskState.SUCCEEDED and task.live_pid is None
    assert [line.text for line in task.log_lines.all()] == ["ran once"]
    wait_until(lambda: f"resent orders for [{task.pk}]" in orchestrator.output(), 10, what="the resend logged")


def test_a_lost_kill_order_still_ends_the_ps_process_and_frees_its_port(online_host, alice, orchestrator):
    host, _agent = online_host
    job = placed_now(alice, host, SERVER, strategy="parameter_server", workers=1, ps=1, devices_per_worker=1)
    wait_until(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, 60, what="every task serving")
    tasks = list(Task.objects.filter(job=job))
    ps = next(t for t in tasks if t.type == "ps")

    with dropping(AGENT_KILL) as dropped:
        assert lifecycle.cancel(job.pk, "alice")
    assert len(dropped) == len(tasks)

    wait_until(
        lambda: not Task.objects.filter(job=job, state__in=("pending", "starting", "running", "stopping")).exists(),
        60,
        what="every task final",
    )
    assert {t.state for t in Task.objects.filter(job=job)} == {TaskState.KILLED}
    assert gone(ps.pid)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", ps.port))  # nothing holds the ps port any more
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
