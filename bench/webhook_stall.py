"""Webhook stall: job start and end latency with ten webhook receivers that answer a byte a second, against without.

    .venv/bin/python bench/webhook_stall.py [--runs 3] [--jobs 5] [--json FILE]

From a fresh shell in the checkout (`make run`'s install in .venv; no services needed): it starts a stack of its own
under a temporary folder (bench/stack.py: embedded PostgreSQL and Redis on free ports, the web server, the
orchestrator, the scheduler's worker, the webhooks worker, the ingest and one agent, as `make run` lays them out),
and ten receivers on loopback that read a POST and then answer one byte a second until the sender hangs up. Staff
registers ten webhooks on the cluster, one per receiver, subscribed to every state a hook may hear.

Each run is a quiet round (the hooks disabled) then a stalled round (the hooks on, every receiver already holding a
delivery before the first job is submitted, each job's own changes adding ten more). A round runs --jobs jobs one
after another: a script without TensorFlow that prints its clock as it starts and as it ends. Start latency: the
submission to the script's first line; end latency: its last line to the job's end as stored. Prints each run's
medians, then the medians over all runs and the ratio stalled / quiet, and how long each delivery held its receiver
(each should end at TFDASH_WEBHOOK_DEADLINE_S). Exits 1 when a ratio is over 1.10 (the README's "within 10 %").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chaos import _free_port_block as free_port_block
from stack import Stack, with_retry

from orchestrator.core.job_states import TERMINAL_JOB_STATES as FINAL
from tests.orchestrator.webhooks.receiver import SlowReceiver

RECEIVERS = 10
TARGET_RATIO = 1.10
SCRIPT = b"""import time
print(f"stall-probe start {time.time():.3f}", flush=True)
time.sleep(0.5)
print(f"stall-probe end {time.time():.3f}", flush=True)
"""


def wait(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = with_retry(what, predicate)
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"[stall] timed out waiting for {what}")


def run_job(owner: Any, cluster_name: str) -> tuple[float, float]:
    """One job, submitted and waited for: (start latency, end latency) in seconds."""
    from orchestrator.models import Cluster, Job, Task
    from orchestrator.submit import submission

    def submit() -> int:
        cluster = Cluster.objects.get(name=cluster_name)
        data = {"name": "stall-probe", "strategy": "mirrored", "workers": 1, "devices_per_worker": 1}
        job, _ = submission.new_job(owner, cluster, data)
        return submission.submit(job, submission.Upload(filename="probe.py", content=SCRIPT)).pk

    job_id = with_retry("submit", submit)
    job = wait(lambda: (j := Job.objects.get(pk=job_id)).state in FINAL and j, 120, f"job {job_id} to end")
    if job.state != "succeeded":
        raise SystemExit(f"[stall] job {job_id} {job.state}: {job.reason}")

    def stamps() -> dict[str, float] | None:
        text = "\n".join(Task.objects.get(job_id=job_id).log_lines.values_list("text", flat=True))
        found = dict(re.findall(r"stall-probe (start|end) ([\d.]+)", text))
        return {k: float(v) for k, v in found.items()} if len(found) == 2 else None

    said = wait(stamps, 30, f"job {job_id}'s two lines")
    return said["start"] - job.created_at.timestamp(), job.finished_at.timestamp() - said["end"]


def run_round(owner: Any, cluster_name: str, jobs: int) -> tuple[float, float]:
    latencies = [run_job(owner, cluster_name) for _ in range(jobs)]
    return statistics.median(s for s, _ in latencies), statistics.median(e for _, e in latencies)


def in_flight(receivers: list[SlowReceiver]) -> int:
    return sum(1 for r in receivers for c in list(r.connections) if c["closed"] is None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="quiet and stalled rounds, alternated")
    parser.add_argument("--jobs", type=int, default=5, help="jobs per round, one after another")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    var = Path(tempfile.mkdtemp(prefix="tfdash-stall-"))
    os.chmod(var, 0o755)  # noqa: S103 - the embedded PostgreSQL runs as its own user when we are root
    (var / "shared").mkdir()
    stack = Stack(var)
    receivers: list[SlowReceiver] = []
    try:
        stack.set_up_django()
        from django.conf import settings
        from django.contrib.auth import get_user_model

        from orchestrator.models import Webhook
        from orchestrator.models.webhooks import notable_states
        from orchestrator.webhooks import hooks

        stack.start_local_cluster(hosts=1, first_port=free_port_block(100))
        from orchestrator.models import Cluster, Host, HostStatus

        wait(lambda: Host.objects.filter(status=HostStatus.ONLINE).count() == len(stack.agents), 90, "the agent")
        users = get_user_model().objects
        owner = users.create_user("stall-user", password="stall-user-pw-1")
        staff = users.create_user("stall-staff", password="stall-staff-pw-1", is_staff=True)
        lab = Cluster.objects.get(name="local")
        receivers = [SlowReceiver() for _ in range(RECEIVERS)]
        for receiver in receivers:
            _, _, errors = hooks.create(staff, receiver.url, cluster=lab, allow_private=True, events=notable_states())
            if errors:
                raise SystemExit(f"[stall] cannot register a hook: {errors}")
        deadline_s = settings.TFDASH_WEBHOOK_DEADLINE_S
        print(
            f"[stall] stack up under {var}; {RECEIVERS} receivers answering a byte a second; deadline "
            f"{deadline_s:g} s; {args.runs} runs of {args.jobs} jobs quiet, then {args.jobs} stalled",
            flush=True,
        )
        Webhook.objects.update(active=False)
        run_job(owner, "local")  # warm: the agent's first launch, the ingest's first batch
        rows: list[dict[str, float]] = []
        for run in range(1, args.runs + 1):
            Webhook.objects.update(active=False)
            wait(lambda: in_flight(receivers) == 0, deadline_s + 15, "the last stalled deliveries to be cut")
            quiet = run_round(owner, "local", args.jobs)
            Webhook.objects.update(active=True)
            run_job(owner, "local")  # its changes start the stalls
            wait(lambda: all(r.connections for r in receivers) and in_flight(receivers) >= RECEIVERS, 30,
                 "every receiver stalling a delivery")  # fmt: skip
            stalled = run_round(owner, "local", args.jobs)
            held_now = in_flight(receivers)
            rows.append({"quiet_start": quiet[0], "quiet_end": quiet[1], "stalled_start": stalled[0],
                         "stalled_end": stalled[1], "in_flight_at_end": held_now})  # fmt: skip
            print(f"[stall] run {run}: start latency {quiet[0]:.3f} s quiet, {stalled[0]:.3f} s stalled; end latency "
                  f"{quiet[1]:.3f} s quiet, {stalled[1]:.3f} s stalled ({held_now} deliveries stalled as the round "
                  f"ended)", flush=True)  # fmt: skip
        Webhook.objects.update(active=False)
        wait(lambda: in_flight(receivers) == 0, deadline_s + 15, "the last stalled deliveries to be cut")
        held = [s for r in receivers for s in r.held_s()]
    finally:
        for receiver in receivers:
            receiver.stop()
        stack.stop_all()
    figures = {
        key: statistics.median(row[key] for row in rows)
        for key in ("quiet_start", "quiet_end", "stalled_start", "stalled_end")
    }
    start_ratio = figures["stalled_start"] / figures["quiet_start"]
    end_ratio = figures["stalled_end"] / figures["quiet_end"]
    print(
        f"[stall] median of {len(rows)} runs: start latency {figures['quiet_start']:.3f} s quiet, "
        f"{figures['stalled_start']:.3f} s stalled, ratio {start_ratio:.3f} "
        f"({figures['stalled_start'] - figures['quiet_start']:+.3f} s); end latency {figures['quiet_end']:.3f} s "
        f"quiet, {figures['stalled_end']:.3f} s stalled, ratio {end_ratio:.3f} "
        f"({figures['stalled_end'] - figures['quiet_end']:+.3f} s)"
    )
    print(f"[stall] deliveries cut: {len(held)}, each held its receiver {min(held):.2f}-{max(held):.2f} s "
          f"(deadline {deadline_s:g} s)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, **figures, "start_ratio": start_ratio, "end_ratio": end_ratio,
                                         "held_s": held, "deadline_s": deadline_s}, indent=2))  # fmt: skip
    shutil.rmtree(var, ignore_errors=True)
    if max(start_ratio, end_ratio) > TARGET_RATIO:
        print(f"[stall] over the target: a ratio above {TARGET_RATIO}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
