"""Ten webhook receivers that answer a byte a second, on the real control plane (orchestrator, scheduler, webhooks
worker, ingest) with a real agent: jobs start and end as fast as without them, each delivery gives up at its
deadline, and no delivery ever runs on the orchestrator's threads (the hosts' events, the watchdog, scheduling).

Before, a delivery ran on an orchestrator thread with per-read timeouts only: such a receiver held it for as long as
it liked, four of them held all four, and task events waited behind them."""

from __future__ import annotations

import os
import re
import signal

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from orchestrator.models import Job, Task, WebhookDelivery
from orchestrator.models.webhooks import notable_states
from orchestrator.webhooks import hooks
from tests.orchestrator.webhooks.receiver import SlowReceiver
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

RECEIVERS = 10
JOBS_PER_ROUND = 5  # before this change, stuck deliveries took all four orchestrator threads within such a round
# A script that says when it started and when it ends, by its own clock (the control plane's stamps are what is
# measured against it), without TensorFlow: the measure is the control plane's, not an import's.
SCRIPT = b"""import time
print(f"stall-probe start {time.time():.3f}", flush=True)
time.sleep(0.5)
print(f"stall-probe end {time.time():.3f}", flush=True)
"""
FINAL = ("succeeded", "failed", "cancelled", "timed_out")
# A cut may come this long after the deadline on a busy machine (a timer's wake-up, the receiver's 0.2 s poll).
LATE_S = 2.0


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("carol", password="pw-carol-123", is_staff=True)


def run_job(api) -> tuple[float, float]:
    """Submit one job and wait for it to end: (start latency, end latency) in seconds, from the submission to the
    script's first line, and from the script's last line to the job's end as stored."""
    response = api.post(
        "/api/jobs/",
        {"name": "stall-probe", "script": SimpleUploadedFile("probe.py", SCRIPT), "strategy": "mirrored",
         "workers": 1, "devices_per_worker": 1},
        format="multipart",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    job = wait_until(
        lambda: (j := Job.objects.get(pk=job_id)).state in FINAL and j, 120, interval=0.1, what=f"job {job_id} ends"
    )
    assert job.state == "succeeded", (job.state, job.reason)
    task = Task.objects.get(job_id=job_id)

    def stamps() -> dict[str, float] | None:
        text = "\n".join(task.log_lines.values_list("text", flat=True))
        found = dict(re.findall(r"stall-probe (start|end) ([\d.]+)", text))
        return {k: float(v) for k, v in found.items()} if len(found) == 2 else None

    said = wait_until(stamps, 30, what="the probe's two lines")
    return said["start"] - job.created_at.timestamp(), job.finished_at.timestamp() - said["end"]


def run_round(api) -> tuple[float, float]:
    """The worst start and end latency of JOBS_PER_ROUND jobs, one after another ("every job")."""
    latencies = [run_job(api) for _ in range(JOBS_PER_ROUND)]
    return max(s for s, _ in latencies), max(e for _, e in latencies)


def thread_stacks(proc) -> str:
    """Every thread's stack in a Celery worker now: Celery's SIGUSR1 handler (`cry`) prints them all; read once the
    output has stopped growing."""
    start = len(proc.lines)
    os.kill(proc.pid, signal.SIGUSR1)
    lengths: list[int] = []

    def printed() -> str | None:
        now = len(proc.lines)
        done = bool(lengths) and lengths[-1] == now and "LOCAL VARIABLES" in "\n".join(proc.lines[start:now])
        lengths.append(now)
        return "\n".join(proc.lines[start:now]) if done else None

    return wait_until(printed, 20, interval=0.3, what=f"{proc.name}'s thread stacks")


# A frame of the webhooks code in a stack as Python prints it.
IN_WEBHOOKS = re.compile(r'File "[^"]*/orchestrator/webhooks/\w+\.py", line \d+')


def within(stalled: float, quiet: float) -> bool:
    # As fast as without, give or take a busy shared machine's noise; a stalled orchestrator costs tens of seconds.
    return stalled <= max(quiet * 1.5, quiet + 2.0)


@pytest.mark.timeout(400)
def test_ten_receivers_answering_a_byte_a_second_change_no_jobs_start_or_end(
    api, staff, orchestrator, cluster_sharing_a_folder
):
    cluster = cluster_sharing_a_folder(1, "stall", 27400)
    deadline_s = settings.TFDASH_WEBHOOK_DEADLINE_S
    run_job(api)  # warm: the agent's first launch, the ingest's first batch
    quiet = run_round(api)

    slows = [SlowReceiver() for _ in range(RECEIVERS)]
    try:
        for slow in slows:
            _, _, errors = hooks.create(staff, slow.url, cluster=cluster, allow_private=True, events=notable_states())
            assert not errors, errors
        run_job(api)  # its changes start the stalls
        wait_until(lambda: any(slow.connections for slow in slows), 30, what="the stalls to begin")
        stalled = run_round(api)
        print(f"start latency {quiet[0]:.2f} s quiet, {stalled[0]:.2f} s with {RECEIVERS} stalled receivers; "
              f"end latency {quiet[1]:.2f} s, {stalled[1]:.2f} s")  # fmt: skip
        assert within(stalled[0], quiet[0]), (stalled, quiet)
        assert within(stalled[1], quiet[1]), (stalled, quiet)
        # Stalled POSTs are in flight now, in the webhooks worker's threads; none in the orchestrator's.
        assert any(c["closed"] is None for slow in slows for c in slow.connections)
        orchestrator_stacks = thread_stacks(orchestrator)
        assert "MainThread" in orchestrator_stacks
        assert not IN_WEBHOOKS.search(orchestrator_stacks), IN_WEBHOOKS.findall(orchestrator_stacks)
        assert IN_WEBHOOKS.search(thread_stacks(orchestrator.webhooks))
        # Every delivery tried so far gave up at its deadline (the stalls began more than a deadline ago).
        wait_until(lambda: all(slow.held_s() for slow in slows), deadline_s + 10, what="a cut at every receiver")
        held = [s for slow in slows for s in slow.held_s()]
        # ...and its outcome is written: a try again after its backoff, never a claim left to run out.
        wait_until(
            lambda: WebhookDelivery.objects.filter(last_error__contains="deadline").count() >= RECEIVERS,
            10,
            what="the cut deliveries' outcomes",
        )
    finally:
        for slow in slows:
            slow.stop()

    assert len(held) >= RECEIVERS and all(s < deadline_s + LATE_S for s in held), held
    # The deliveries ran in the webhooks worker (each try logs a line there), never on the orchestrator's threads.
    tries = re.compile(r"webhook \d+ delivery \S+ try \d+")
    assert tries.search(orchestrator.webhooks.output())
    assert not tries.search(orchestrator.output())
