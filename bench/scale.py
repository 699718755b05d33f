"""The control plane at fleet scale: a simulated fleet on the real orchestrator, ingest and web, measured.

    .venv/bin/python bench/scale.py [--hosts 500] [--jobs 1000] [--minutes 4] [--sim-procs 2] [--sim-idle] [--json FILE]
                                    [--policy backfill|fifo] [--packing spread|pack] [--seed N]
                                    [--duration 20 60] [--schedule-interval S] [--scheduler-shared] [--scheduler-equal]

A stack of its own (bench/chaos.py's: embedded PostgreSQL and Redis on free ports, Daphne, the orchestrator as a
Celery worker + beat, the scheduler's worker, the metrics ingest) and `--hosts` simulated agents with 8 GPUs each
(bench/fleet_sim.py, in `--sim-procs` processes) that speak the real protocol through the real broker. Phases:

1. idle fleet: every host heartbeats at the real interval for `--idle-s`; the orchestrator's CPU over that window is
   the heartbeat handling cost;
2. `--jobs` gang jobs submitted through the real submission path (MultiWorkerMirrored with 1-64 workers,
   ParameterServer with chief and ps, Mirrored; some wider than the free GPUs, so they wait), run for a drawn
   duration and reporting metrics at 1 Hz, until every job ended or `--minutes` passed;
2b. `--ingest-tasks` running tasks (written directly, spread over the hosts) reporting a metric batch each per second
   on the real stream for `--ingest-s`: the ingest's points stored per second;
3. the database filled up to `--page-jobs` jobs (finished ones written directly), then the jobs list, a job page and
   the cluster page fetched from Daphne by a signed-in staff user.

Jobs get time limits the way users give them: 1.5-5x their true run time (drawn per job from the seed; people
overestimate), never the true time. `--policy` runs the scheduler with backfill (the default) or strict FIFO on the
same seed; the table then has GPU utilization over the jobs phase (device-seconds in use / available), jobs finished,
mean and p95 wait, and the head's start against its first reservation.

It prints one table (with the load average, and the CPU each process used over the jobs phase: on a small machine
the stack, the simulated fleet and the databases share its cores; `--sim-idle` runs the fleet, which stands in for
other machines, at Linux's idle CPU priority and its session's autogroup at nice 19, so that it takes only what the
stack leaves: on a machine with no core to spare the fleet then falls behind what it must report, README "Sizing";
the scheduler's worker runs first in line for a core, as `make run` starts it, unless `--scheduler-equal`) and checks
correctness: every job placed exactly once (one set of tasks for attempt 1), every job that ended succeeded, no port
or device booked twice, no healthy host ever marked offline, no order refused; with `--until-done` also that every
job ended within `--minutes`. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stack import SCHEDULER_NICE, Stack, with_retry  # noqa: E402 - bench/stack.py (a script's folder is on its path)

from orchestrator.core.scheduler_policy import DEFAULT_POLICY, POLICIES  # noqa: E402

PY = sys.executable
PORTS_PER_HOST = 100
DURATION = (20.0, 60.0)  # the true run times drawn by default, s (--duration)
SUCCEEDED = re.compile(r"Task (orchestrator\.\w+)\[[^\]]+\] succeeded in ([0-9.e-]+)s")
PASS_PLACED = re.compile(
    r"scheduler pass over cluster \d+ placed (\d+) task\(s\) of (\d+) job\(s\) in ([0-9.]+) s \(([0-9.]+) s of CPU"
    r"(?:, ([0-9.]+) s waiting for a core)?\)"
)
FIRST_RESERVED = re.compile(r"job (\d+) first reserved at depth (\d+) for (\S+)")


def job_mix(count: int, rng: random.Random, gpus: int = 4000) -> list[dict[str, Any]]:
    """Mixed gang jobs: mostly small MultiWorkerMirrored, some wide ones (up to 64 workers of 8 GPUs, 512 GPUs: wider
    than what is free while the fleet is busy, so they wait at the head of the queue), ParameterServer, Mirrored."""
    jobs = []
    for i in range(count):
        kind = rng.choices(["mwms", "ps", "mirrored"], weights=[6, 2, 2])[0]
        if kind == "mwms":
            workers = rng.choices([1, 2, 4, 8, 16, 32, 64], weights=[30, 22, 16, 12, 8, 4, 2])[0]
            devices = rng.choices([1, 2, 4, 8], weights=[5, 3, 2, 1])[0]
            while workers * devices > gpus // 2 and workers > 1:  # a small fleet: wide jobs wait, never fail
                workers //= 2
            shape = {"strategy": "multi_worker_mirrored", "workers": workers, "devices_per_worker": devices}
        elif kind == "ps":
            shape = {"strategy": "parameter_server", "workers": rng.choice([1, 2, 4, 8]), "ps": rng.choice([1, 2]),
                     "devices_per_worker": rng.choice([1, 2])}  # fmt: skip
        else:
            shape = {"strategy": "mirrored", "workers": 1, "devices_per_worker": rng.choice([1, 2, 4, 8])}
        # No checkpoints: the simulated hosts are separate machines with no shared folder, where a ParameterServer
        # job's checkpoints are refused (each ps writes at the chief's path on its own disk); nothing trains here.
        jobs.append({"name": f"scale-{i}-{kind}", "max_restarts": 0, "builtin": "digits_mlp",
                     "builtin_config": {"epochs": 1, "checkpoint": False}, **shape})  # fmt: skip
    return jobs


def expected_tasks(shape: dict[str, Any]) -> int:
    if shape["strategy"] == "parameter_server":
        return 1 + shape["workers"] + shape["ps"]
    return int(shape["workers"])


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            procs = [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
    return total


def cpu_by_process(stack: Stack, sims: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    """CPU seconds so far of each of the stack's processes (with their children: PostgreSQL's backends), the simulated
    fleet's together, this bench's own, and the machine's busy and stolen seconds (all cores)."""
    groups: dict[str, list[int]] = {}
    for name, child in list(stack.children.items()):
        if not name.startswith("agent-"):
            groups.setdefault(re.sub(r"-\d+$", "", name), []).append(child.proc.pid)
    groups["fleet sim"] = [proc.pid for proc in sims]
    taken = {name: cpu_seconds(pids) for name, pids in groups.items()}
    own = psutil.Process().cpu_times()
    taken["this bench"] = own.user + own.system
    machine = psutil.cpu_times()
    taken["machine busy"] = sum(getattr(machine, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))
    taken["machine stolen"] = getattr(machine, "steal", 0.0)  # (the hypervisor ran something else on our cores)
    return taken


def cpu_shares(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """% of one core each used between two `cpu_by_process` readings `seconds` apart, largest first."""
    used = {name: round((after.get(name, 0.0) - before[name]) / seconds * 100, 1) for name in before}
    return dict(sorted(used.items(), key=lambda kv: -kv[1]))


class PlacingPass(NamedTuple):
    tasks: int
    seconds: float
    cpu: float  # its thread's CPU seconds
    waiting: float  # seconds its thread waited for a core (nan where the kernel does not say)


def placing_passes(logs: list[Path]) -> list[PlacingPass]:
    """Every scheduler pass that placed something, from the orchestrators' logs."""
    return [PlacingPass(int(m.group(1)), float(m.group(3)), float(m.group(4)), float(m.group(5) or "nan"))
            for log in logs for m in PASS_PLACED.finditer(log.read_text(errors="replace"))]  # fmt: skip


def head_promises(logs: list[Path], job_ids: list[int]) -> dict[str, Any]:
    """EASY backfill's promise, from the schedulers' logs: a job whose first reservation was made while it was the
    queue's head (depth 0, the first job that did not fit) starts by it. Deeper reservations may move (a job ahead
    is planned afresh); they are counted apart."""
    from datetime import datetime

    from orchestrator.models import Job

    first: dict[int, tuple[int, float]] = {}
    for log in logs:
        for m in FIRST_RESERVED.finditer(log.read_text(errors="replace")):
            first.setdefault(int(m.group(1)), (int(m.group(2)), datetime.fromisoformat(m.group(3)).timestamp()))
    placed = dict(Job.objects.filter(pk__in=job_ids, placed_at__isnull=False).values_list("pk", "placed_at"))
    late: dict[bool, list[float]] = {True: [], False: []}
    count = {True: 0, False: 0}
    for job_id, (depth, at) in first.items():
        if job_id in placed:
            count[depth == 0] += 1
            if placed[job_id].timestamp() > at:
                late[depth == 0].append(placed[job_id].timestamp() - at)
    return {
        "jobs first reserved as the queue's head: started after it (of); latest by, s": (
            len(late[True]), count[True], max(late[True], default=0.0)),
        "jobs first reserved deeper: started after it (of); latest by, s": (
            len(late[False]), count[False], max(late[False], default=0.0)),
    }  # fmt: skip


def handler_times(logs: list[Path]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    for log in logs:
        for match in SUCCEEDED.finditer(log.read_text(errors="replace")):
            times.setdefault(match.group(1), []).append(float(match.group(2)))
    return times


def shipped_liveness(interval_s: float) -> dict[str, str]:
    """The watchdog's timing as shipped, scaled to the simulated fleet's heartbeat interval: agents beat every 3 s and
    a host is silent after 15 s (5 beats), judged every second, orders resent after 10 s. Set explicitly so that the
    caller's environment cannot change what is measured: the suite's own settings (a 4 s timeout for its agents'
    half-second beats) left a fleet beating every 3 s one second of slack, and a loaded machine took it."""
    return {
        "TFDASH_HEARTBEAT_TIMEOUT_S": str(5 * interval_s),
        "TFDASH_WATCHDOG_INTERVAL_S": "1.0",
        "TFDASH_ORDER_RESEND_S": "10.0",
    }


class ScaleStack(Stack):
    """bench/chaos.py's stack, with more orchestrator workers on the same queue when asked (`orchestrator-N`: no
    beat, one beat is enough)."""

    def _command(self, name: str) -> tuple[list[str], dict[str, str], dict[str, Any]]:
        if not name.startswith("orchestrator-"):
            return super()._command(name)
        queues = "orchestrator" if self.scheduler_apart else "orchestrator,scheduler"
        argv = [PY, "-m", "celery", "-A", "config", "worker", "-Q", queues, "--pool", "threads", "-c", "4",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-l", "INFO", "--hostname", f"{name}@%h"]  # fmt: skip
        return argv, self.env, {}

    def orchestrator_logs(self) -> list[Path]:
        """The logs of every worker of the control plane's queues (the scheduler's own, when apart)."""
        return sorted([*self.logs.glob("orchestrator*.log"), *self.logs.glob("scheduler*.log")])


# --- setup ---------------------------------------------------------------------------------------------------------
def register_fleet(hosts: int, packing: str = "spread") -> list[dict[str, Any]]:
    from orchestrator.identity import tokens
    from orchestrator.models import Cluster, Host

    cluster = Cluster.objects.create(name="scale", packing=packing)
    rows, entries = [], []
    for i in range(hosts):
        host = Host(cluster=cluster, name=f"sim-{i:04d}", address=f"10.{i // 250}.{i % 250}.1", port_min=20000,
                    port_max=20000 + PORTS_PER_HOST - 1)  # fmt: skip
        token = tokens.set_new_token(host)
        rows.append(host)
        entries.append({"name": host.name, "token": token, "port_min": host.port_min, "port_max": host.port_max})
    Host.objects.bulk_create(rows)
    return entries


def heartbeats_read(redis_url: str, fleet: list[dict[str, Any]]) -> int:
    """Entries the orchestrators' heartbeat readers have read from the hosts' streams so far (the groups' counters)."""
    import redis

    from contracts import broker
    from contracts.protocol import HEARTBEAT_GROUP

    pipe = redis.Redis.from_url(redis_url).pipeline(transaction=False)
    for host in fleet:
        pipe.xinfo_groups(broker.stream(host["name"], broker.HEARTBEATS))
    ours = (HEARTBEAT_GROUP, HEARTBEAT_GROUP.encode())
    read = 0
    for groups in pipe.execute(raise_on_error=False):
        if isinstance(groups, list):  # a stream not made yet answers with an error
            read += sum(int(g.get("entries-read") or 0) for g in groups if g["name"] in ours)
    return read


def backlog(client: Any, fleet: list[dict[str, Any]], kind: str) -> int:
    """Entries waiting in the hosts' `kind` streams (readers delete what they acknowledged)."""
    from contracts import broker

    pipe = client.pipeline(transaction=False)
    for host in fleet:
        pipe.xlen(broker.stream(host["name"], kind))
    return sum(pipe.execute())


def wait_online(count: int, timeout_s: float) -> float:
    from orchestrator.models import Host, HostStatus

    start = time.monotonic()
    while with_retry("hosts", lambda: Host.objects.filter(status=HostStatus.ONLINE).count()) < count:
        if time.monotonic() - start > timeout_s:
            raise SystemExit(f"the simulated hosts did not all come online within {timeout_s:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - start


def submit_jobs(shapes: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    from django.contrib.auth import get_user_model

    from orchestrator.models import Cluster
    from orchestrator.submit import submission

    owner = get_user_model().objects.get_or_create(username="scale", defaults={"is_staff": True})[0]
    cluster = Cluster.objects.get(name="scale")
    submitted = {}
    for data in shapes:
        job, upload = submission.new_job(owner, cluster, data)
        submitted[submission.submit(job, upload).pk] = data
    return submitted


def true_run_time(job_id: int, duration: tuple[float, float]) -> float:
    """What bench/fleet_sim.py runs a job's gang for (it draws from the job id the same way), plus its jitter."""
    return random.Random(job_id).uniform(*duration) + 0.5


# Start-up a user's limit also covers (placement to the process's start; seconds on a loaded machine), so that a run
# of a few simulated seconds is not cut by its own launch.
LIMIT_SLACK_S = 10


def give_time_limits(job_ids: list[int], duration: tuple[float, float], rng: random.Random) -> None:
    """Each job's time limit as a user would give it: 1.5-5x its true run time (plus the start-up slack). Written to
    the rows (the form's one-minute minimum is for people; the simulated runs are shorter)."""
    from orchestrator.models import Job

    for job_id in job_ids:
        Job.objects.filter(pk=job_id).update(time_limit_s=drawn_limit(job_id, duration, rng))


def drawn_limit(job_id: int, duration: tuple[float, float], rng: random.Random) -> int:
    """The time limit a user gives a job: 1.5-5x its true run time, plus the start-up slack (bench/queue_replay.py
    draws the same)."""
    return math.ceil(true_run_time(job_id, duration) * rng.uniform(1.5, 5.0)) + LIMIT_SLACK_S


def queue_figures(job_ids: list[int], start: float, end: float, devices: int) -> dict[str, Any]:
    """Utilization, throughput, waits and the head's promise over the jobs phase [start, end] (wall seconds)."""
    from orchestrator.models import Job, Task

    jobs = list(Job.objects.filter(pk__in=job_ids).values_list("state", "placed_at", "first_reservation_at"))
    # The queue is non-empty until the last job is placed (or to the phase's end, when some never were).
    queued_until = end if any(p is None for _s, p, _r in jobs) else max(p.timestamp() for _s, p, _r in jobs)
    used = used_queued = 0.0
    for task_devices, began, ended in Task.objects.filter(job__in=job_ids, started_at__isnull=False).values_list(
        "devices", "started_at", "finished_at"
    ):
        lo, hi = max(began.timestamp(), start), min(ended.timestamp() if ended else end, end)
        used += len(task_devices or ()) * max(0.0, hi - lo)
        used_queued += len(task_devices or ()) * max(0.0, min(hi, queued_until) - lo)
    waits = [(placed.timestamp() if placed else end) - start for _state, placed, _reserved in jobs]
    promised = [(placed.timestamp() - reserved.timestamp()) for _s, placed, reserved in jobs if placed and reserved]
    head = min(((r, p) for _s, p, r in jobs if r is not None), key=lambda rp: rp[0], default=None)
    figures: dict[str, Any] = {
        "GPU utilization over the jobs phase, %": used / (devices * max(end - start, 1e-9)) * 100,
        "GPU utilization while jobs waited (to the last placement), %": used_queued
        / (devices * max(queued_until - start, 1e-9))
        * 100,
        "queue non-empty for, s": queued_until - start,
        "jobs finished (succeeded) in the jobs phase": sum(1 for state, *_ in jobs if state == "succeeded"),
        "wait mean / p95, s (unplaced: to the phase's end)": (statistics.fmean(waits), pct(waits, 95)),
        "reserved jobs (any depth) started > 1 s after their first estimate (of)": (
            sum(1 for d in promised if d > 1.0),
            len(promised),
        ),
        "reserved jobs (any depth) started after their first estimate at all; latest by, s": (
            sum(1 for d in promised if d > 0.0),
            max(promised, default=float("nan")),
        ),
    }
    if head is not None:
        reserved, placed = head
        figures["head: first reservation / start, s after the queue's commit"] = (
            reserved.timestamp() - start,
            (placed.timestamp() - start) if placed else float("nan"),
        )
    return figures


def booked_time(
    job_ids: list[int], received: dict[int, float], ended: dict[int, float], phase: tuple[float, float]
) -> dict[str, Any]:
    """Where a task's devices were booked but no process ran on them (the control plane's share of idle devices):
    placement -> the agent has the launch order, and the process's end there -> the devices free again (its EXITED
    applied). Device-seconds within the jobs phase, from the orchestrator's rows and the simulated agents' clocks."""
    from orchestrator.models import Task

    start, end = phase
    booked = ran = 0.0
    to_launch: list[float] = []
    to_free: list[float] = []
    rows = Task.objects.filter(job__in=job_ids, attempt=1).values_list("pk", "devices", "job__placed_at", "finished_at")
    for task_id, devices, placed_at, finished_at in rows:
        if not devices or placed_at is None:
            continue
        placed, freed = placed_at.timestamp(), finished_at.timestamp() if finished_at else end
        booked += len(devices) * max(0.0, min(freed, end) - max(placed, start))
        if task_id in received:
            to_launch.append(received[task_id] - placed)
            stop = ended.get(task_id, end)
            ran += len(devices) * max(0.0, min(stop, end) - max(received[task_id], start))
            if task_id in ended and finished_at is not None:
                to_free.append(freed - ended[task_id])
    return {
        "device-time booked that ran at the agents, %": ran / booked * 100 if booked else float("nan"),
        "placed -> launch order at the agent p50/p95, s": (pct(to_launch, 50), pct(to_launch, 95)),
        "process ended -> devices free (EXITED applied) p50/p95, s": (pct(to_free, 50), pct(to_free, 95)),
    }


def fill_history(total: int) -> None:
    """Finished jobs written directly (as months of use would leave them), each with its tasks, up to `total`."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from orchestrator.models import Cluster, Host, Job, JobState, Task, TaskState

    missing = total - Job.objects.count()
    if missing <= 0:
        return
    owner = get_user_model().objects.get(username="scale")
    cluster = Cluster.objects.get(name="scale")
    hosts = list(Host.objects.filter(cluster=cluster)[:8])
    now = timezone.now()
    for start in range(0, missing, 1000):
        jobs = Job.objects.bulk_create(
            [
                written_job(
                    owner, cluster, f"history-{start + i}", 2, state=JobState.SUCCEEDED, placed_at=now, finished_at=now
                )
                for i in range(min(1000, missing - start))
            ]
        )
        Task.objects.bulk_create(
            [
                written_task(
                    job, k, hosts[k % len(hosts)], 20000 + k, state=TaskState.SUCCEEDED, exit_code=0, finished_at=now
                )
                for job in jobs
                for k in range(2)
            ]
        )


def written_job(owner: Any, cluster: Any, name: str, workers: int, **fields: Any) -> Any:
    """A job written directly (not submitted): MultiWorkerMirrored, one device per worker, placed for attempt 1;
    `fields` say when and how far it got."""
    from orchestrator.models import Job

    return Job(owner=owner, cluster=cluster, name=name, strategy="multi_worker_mirrored", program_kind="builtin",
               builtin="digits_mlp", workers=workers, devices_per_worker=1, attempt=1, **fields)  # fmt: skip


def written_task(job: Any, index: int, host: Any, port: int, **fields: Any) -> Any:
    """Worker `index` of a `written_job` on `host`, holding device `index`."""
    from orchestrator.models import Task

    return Task(job=job, attempt=1, type="worker", index=index, host=host, port=port, devices=[index], **fields)


def booked_twice(job_ids: list[int], pass_s: float) -> tuple[int, int]:
    """(ports, devices) the orchestrator booked twice, from its own rows: a task placed on a host while another
    task there held the same port or device (placed, not yet final). Placement times are the jobs' (one attempt each:
    the bench runs jobs without restarts).

    A pass stamps its placements with the time it began, and reads what is in use a little later, so a task that
    ended (its end stamped, then committed) in between is rightly seen as free, with an end after the placement's
    stamp. Only an overlap longer than the longest pass (`pass_s`) is a double booking; a shorter real one would still
    show at the agents (`seen at the agents`)."""
    from orchestrator.models import ACTIVE_TASK_STATES, Task

    rows = Task.objects.filter(job__in=job_ids, host__isnull=False).values_list(
        "host_id", "port", "devices", "job__placed_at", "finished_at", "state"
    )
    by_host: dict[int, list[tuple[Any, Any, int | None, set[int]]]] = {}
    for host_id, port, devices, placed_at, finished_at, state in rows:
        # A final task with no end time never held anything past its placement (stopped before it started).
        end = finished_at if finished_at is not None or state in ACTIVE_TASK_STATES else placed_at
        by_host.setdefault(host_id, []).append((placed_at, end, port, set(devices or [])))
    ports = devices_twice = 0
    for tasks in by_host.values():
        tasks.sort(key=lambda t: t[0])
        for i, (placed, _end, port, devices) in enumerate(tasks):
            for other_placed, other_end, other_port, other_devices in tasks[:i]:
                if other_placed <= placed and (
                    other_end is None or placed.timestamp() + pass_s < other_end.timestamp()
                ):
                    ports += port is not None and port == other_port
                    devices_twice += bool(devices & other_devices)
    return ports, devices_twice


def ingest_phase(fleet: list[dict[str, Any]], tasks: int, seconds: float, redis_url: str) -> dict[str, Any]:
    import redis
    from django.contrib.auth import get_user_model
    from django.utils import timezone
    from fleet_sim import sim_facts

    from contracts import broker
    from contracts.bundles import bundle_entries
    from contracts.host_reports import HostReport, RunningTask, TaskReport
    from contracts.metric_messages import TaskMetricsBatch
    from contracts.protocol import AGENT_HEARTBEAT, STREAM_MAXLEN, TASK_METRICS, stream_entry
    from contracts.signing import agent_mac_key, seal
    from orchestrator.models import Cluster, Host, Job, JobState, MetricPoint, Task, TaskState

    owner = get_user_model().objects.get(username="scale")
    cluster = Cluster.objects.get(name="scale")
    hosts = {h.name: h for h in Host.objects.filter(cluster=cluster)}
    per_host = max(1, tasks // len(fleet))
    now = timezone.now()
    jobs = Job.objects.bulk_create(
        [
            written_job(
                owner, cluster, f"ingest-{e['name']}", per_host, state=JobState.RUNNING, placed_at=now, started_at=now
            )
            for e in fleet
        ]
    )
    rows = Task.objects.bulk_create(
        [
            written_task(job, k, hosts[e["name"]], 21000 + k, state=TaskState.RUNNING, started_at=now)
            for job, e in zip(jobs, fleet, strict=True)
            for k in range(per_host)
        ]
    )
    keys = {e["name"]: agent_mac_key(e["token"], e["name"]) for e in fleet}
    reporting = [(t.host.name, t.pk) for t in rows]
    running: dict[str, list[RunningTask]] = {}
    for t in rows:
        running.setdefault(t.host.name, []).append(RunningTask(t.job_id, t.pk, 1, 1))
    client = redis.Redis.from_url(redis_url)
    first = MetricPoint.objects.filter(task__in=rows).count()
    start = time.monotonic()
    step = sent = 0
    backlog_before = backlog(client, fleet, broker.METRICS)  # what the jobs phase left unstored, before this phase
    next_beat = start
    while time.monotonic() - start < seconds:
        step += 1
        tick = time.monotonic()
        pipe = client.pipeline(transaction=False)
        if tick >= next_beat:  # the simulated agents are stopped: their hosts beat from here, saying what runs
            next_beat = tick + 3.0
            for e in fleet:
                report = HostReport(sim_facts(e["name"], (e["port_min"], e["port_max"])),
                                    TaskReport(running=running.get(e["name"], [])))  # fmt: skip
                sealed = seal(keys[e["name"]], e["name"], AGENT_HEARTBEAT, report.to_body())
                pipe.xadd(broker.stream(e["name"], broker.HEARTBEATS), stream_entry(AGENT_HEARTBEAT, sealed))
        by_host: dict[str, list[tuple[str, Any]]] = {}
        for host, task_id in reporting:
            point = {"kind": "metric", "ts": time.time(), "mono": tick, "step": step, "epoch": None,
                     "phase": "train", "metrics": {"loss": 1.0 / step, "examples_per_s": 1000.0}}  # fmt: skip
            by_host.setdefault(host, []).append((TASK_METRICS, asdict(TaskMetricsBatch(task_id, 1, [point]))))
            sent += len(point["metrics"])  # a stored row per metric
        # As the agent's outbox: what a host's tasks reported together goes as one sealed bundle (contracts/bundles.py).
        for host, reports in by_host.items():
            for entry in bundle_entries(reports, functools.partial(seal, keys[host], host)):
                pipe.xadd(broker.stream(host, broker.METRICS), entry, maxlen=STREAM_MAXLEN[broker.METRICS],
                          approximate=True)  # fmt: skip
            if len(pipe) >= 500:
                pipe.execute()
        pipe.execute()
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    sent_s = time.monotonic() - start
    stored = MetricPoint.objects.filter(task__in=rows).count() - first
    left = backlog(client, fleet, broker.METRICS)
    drain_start = time.monotonic()
    while backlog(client, fleet, broker.METRICS) and time.monotonic() - drain_start < 120:
        time.sleep(0.5)
    drained = MetricPoint.objects.filter(task__in=rows).count() - first
    Task.objects.filter(pk__in=[t.pk for t in rows]).update(state=TaskState.SUCCEEDED, exit_code=0, finished_at=now)
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(state=JobState.SUCCEEDED, finished_at=now)
    return {
        "ingest at full fleet: tasks reporting at 1 Hz": len(rows),
        "ingest at full fleet: stream backlog at the start, entries": backlog_before,
        "ingest at full fleet: points sent/s": sent / sent_s,
        "ingest at full fleet: points stored/s": stored / sent_s,
        "ingest at full fleet: stream backlog at the end, entries": left,
        "ingest at full fleet: all stored, s after the last was sent": time.monotonic() - drain_start
        if drained == sent
        else float("nan"),
    }


def page_latencies(base: str, job_id: int, loads: int) -> dict[str, list[float]]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username="scale"))
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    pages = {"jobs list": "/jobs/", "job page": f"/jobs/{job_id}/", "cluster page": "/clusters/"}
    times: dict[str, list[float]] = {name: [] for name in pages}
    for name, path in pages.items():
        for i in range(loads + 1):
            request = urllib.request.Request(base + path, headers={"Cookie": cookie})  # noqa: S310 - http, ours
            start = time.perf_counter()
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - our own loopback server
                response.read()
                if response.status != 200:
                    raise SystemExit(f"{path} answered {response.status}")
            if i:  # the first load warms the server's caches and connections
                times[name].append((time.perf_counter() - start) * 1000)
    return times


# --- the run -------------------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=4.0, help="bound on the jobs phase")
    parser.add_argument("--idle-s", type=float, default=30.0, help="heartbeat-only window measured")
    parser.add_argument("--baseline-s", type=float, default=15.0, help="window measured before the fleet starts")
    parser.add_argument("--start-up-s", type=float, default=5.0,
                        help="left to the control plane's start-up before that window (the suite's runs, which "
                        "assert no CPU figure: 0)")  # fmt: skip
    parser.add_argument("--interval", type=float, default=3.0, help="heartbeat interval (the agent's default)")
    parser.add_argument("--duration", type=float, nargs=2, default=DURATION, help="task run time drawn, s")
    parser.add_argument("--sim-procs", type=int, default=2)
    parser.add_argument(
        "--sim-idle", action="store_true", help="the simulated fleet at idle CPU priority: only what the stack leaves"
    )
    parser.add_argument("--ingest-tasks", type=int, default=4000, help="tasks reporting in the ingest phase (0: none)")
    parser.add_argument("--ingest-s", type=float, default=20.0)
    parser.add_argument("--ingest-partitions", type=int, default=1, help="ingest processes (TFDASH_INGEST_PARTITIONS)")
    parser.add_argument("--page-jobs", type=int, default=10_000)
    parser.add_argument("--page-loads", type=int, default=20)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument(
        "--until-done",
        action="store_true",
        help="a job not final after --minutes is a failure (the suite's small runs); otherwise it is "
        "a figure: strict FIFO holds small jobs behind a wide one while the fleet drains for it",
    )
    parser.add_argument("--orchestrators", type=int, default=1, help="orchestrator workers on the one queue")
    parser.add_argument("--policy", choices=tuple(POLICIES), default=DEFAULT_POLICY, help="the scheduler's policy")
    parser.add_argument("--packing", choices=("spread", "pack"), default="spread", help="the cluster's packing")
    parser.add_argument("--schedule-interval", type=float, help="TFDASH_SCHEDULE_INTERVAL_S (default: as shipped)")
    parser.add_argument("--scheduler-shared", action="store_true",
                        help="the orchestrator's worker takes the scheduler passes too (-Q orchestrator,scheduler), "
                        "the layout before; as shipped they have a worker of their own (-Q scheduler)")  # fmt: skip
    parser.add_argument("--scheduler-equal", action="store_true",
                        help="the scheduler's worker at the CPU priority of every other process; as `make run` "
                        f"starts it, its session runs at nice {SCHEDULER_NICE} where allowed")  # fmt: skip
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    wall_start = time.monotonic()
    load_start = os.getloadavg()
    var = Path(tempfile.mkdtemp(prefix="tfdash-scale-"))
    os.chmod(var, 0o755)  # noqa: S103 - the embedded PostgreSQL runs as its own user when we are root
    stack = ScaleStack(var, scheduler_apart=not args.scheduler_shared,
                       scheduler_nice=None if args.scheduler_equal else SCHEDULER_NICE)  # fmt: skip
    # DB_CONN_MAX_AGE: the orchestrator keeps its database connections (README "Sizing"); without it every message
    # opens one. TFDASH_TRACE_LOG_LEVEL: each handler's run time in the log, read below.
    stack.env.update({"TFDASH_MAX_ACTIVE_JOBS_PER_USER": "1000000", "DEBUG": "0", "LOG_LEVEL": "INFO",
                      "DB_CONN_MAX_AGE": "60", "TFDASH_TRACE_LOG_LEVEL": "INFO",
                      "TFDASH_SCHEDULER_POLICY": args.policy, **shipped_liveness(args.interval)})  # fmt: skip
    # Passes a cluster apart: as shipped unless asked (the suite's own, shorter, must not reach the bench's stack).
    stack.env.pop("TFDASH_SCHEDULE_INTERVAL_S", None)
    if args.schedule_interval is not None:
        stack.env["TFDASH_SCHEDULE_INTERVAL_S"] = str(args.schedule_interval)
    sims: list[subprocess.Popen[bytes]] = []
    results: dict[str, Any] = {"hosts": args.hosts, "jobs": args.jobs, "seed": args.seed, "policy": args.policy,
                               "packing": args.packing, "duration drawn, s": tuple(args.duration),
                               "schedule interval, s": args.schedule_interval or "as shipped",
                               "scheduler": "in the orchestrator" if args.scheduler_shared else "a worker of its own",
                               "load at start": load_start}  # fmt: skip
    failures: list[str] = []
    print(f"[scale] {args.hosts} hosts x 8 GPUs, {args.jobs} jobs; stack under {var}", flush=True)
    try:
        stack.set_up_django("TFDASH_MAX_ACTIVE_JOBS_PER_USER")
        from orchestrator.agents.reports import REPORT_LAG
        from orchestrator.identity.keys import control_public_key
        from orchestrator.plumbing import counters

        fleet = register_fleet(args.hosts, args.packing)
        stack.env["TFDASH_INGEST_PARTITIONS"] = str(args.ingest_partitions)
        ingests = ("ingest", *(f"ingest-{p}" for p in range(1, args.ingest_partitions)))
        apart = ("scheduler",) if stack.scheduler_apart else ()
        for name in ("orchestrator", *(f"orchestrator-{n}" for n in range(2, args.orchestrators + 1)), *apart,
                     *ingests, "web"):  # fmt: skip
            stack.start(name)
        if stack.scheduler_apart:  # what the kernel says, whatever was asked (a user without CAP_SYS_NICE gets 0)
            nice = stack.session_nice("scheduler")
            results["scheduler's session nice"] = "no autogroups" if nice is None else nice
        # 0. no fleet yet: what the orchestrator costs by itself (Celery, beat, the watchdog's ticks over the
        # registered hosts), so that the heartbeats' own share can be told apart.
        control = ("orchestrator", "scheduler")
        orchestrator_pids = [c.proc.pid for n, c in stack.children.items() if n.startswith(control)]
        time.sleep(args.start_up_s)  # past start-up
        base0, tb0 = cpu_seconds(orchestrator_pids), time.monotonic()
        time.sleep(args.baseline_s)
        baseline = (cpu_seconds(orchestrator_pids) - base0) / (time.monotonic() - tb0) * 100
        results["orchestrator CPU with no fleet, % of a core"] = baseline
        per = max(1, math.ceil(len(fleet) / args.sim_procs))
        for n in range(0, len(fleet), per):
            config = {"redis_url": stack.env["REDIS_URL"], "control_key": control_public_key(),
                      "hosts": fleet[n:n + per], "interval_s": args.interval, "duration_s": list(args.duration),
                      "workdir": str(var / "sim"), "seed": n, "out": str(var / f"sim-{n}.json"),
                      "cpu_idle": args.sim_idle}  # fmt: skip
            path = var / f"sim-{n}.config.json"
            path.write_text(json.dumps(config))
            log = (stack.logs / f"sim-{n}.log").open("wb")
            argv = [PY, str(ROOT / "bench" / "fleet_sim.py"), str(path)]
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            sims.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env))
        online_s = wait_online(args.hosts, 120 + args.hosts * 0.2)
        print(f"[scale] {args.hosts} hosts online after {online_s:.1f} s", flush=True)

        # 1. idle fleet: heartbeats only.
        pg_pid = stack.children["postgres"].proc.pid
        read0 = heartbeats_read(stack.env["REDIS_URL"], fleet)
        cpu0, pg0, t0 = cpu_seconds(orchestrator_pids), cpu_seconds([pg_pid]), time.monotonic()
        time.sleep(args.idle_s)
        cpu1, pg1, t1 = cpu_seconds(orchestrator_pids), cpu_seconds([pg_pid]), time.monotonic()
        beats = heartbeats_read(stack.env["REDIS_URL"], fleet) - read0
        window = t1 - t0
        per100 = (cpu1 - cpu0) / window / (args.hosts / 100) * 100
        results["heartbeats read/s (idle)"] = beats / window
        results["heartbeat CPU per 100 hosts, % of a core (orchestrator)"] = per100
        results[f"orchestrator CPU with {args.hosts} hosts beating, % of a core"] = per100 * args.hosts / 100
        results[f"heartbeat handling for {args.hosts} hosts, % of a core (the difference)"] = (
            per100 * args.hosts / 100 - baseline
        )
        pg_per100 = (pg1 - pg0) / window / (args.hosts / 100) * 100
        results["heartbeat CPU per 100 hosts, % of a core (PostgreSQL)"] = pg_per100
        lags = list(counters.recent_readings(REPORT_LAG, max_age_s=args.interval * 2).values())
        results["heartbeat sent->applied p50/p99, ms (newest per host)"] = (pct(lags, 50) * 1000, pct(lags, 99) * 1000)
        print(f"[scale] idle: {beats / window:.0f} heartbeats/s, {per100:.1f}% of a core per 100 hosts", flush=True)

        # 2. the jobs.
        from django.db import transaction
        from django.db.models import Count, Max

        from orchestrator.models import TERMINAL_JOB_STATES, Host, HostStatus, Job, MetricPoint, Task

        shapes = job_mix(args.jobs, random.Random(args.seed), gpus=args.hosts * 8)
        submit_start = time.time()
        # In one transaction: the queue is there at once (as for an orchestrator that comes back to a full queue),
        # and the first pass sees all of it.
        committed: list[float] = []
        with transaction.atomic():
            transaction.on_commit(lambda: committed.append(time.time()))  # the first hook: at the commit itself
            submitted = submit_jobs(shapes)
            give_time_limits(list(submitted), args.duration, random.Random(args.seed + 1))
        submit_s = committed[0] - submit_start
        print(f"[scale] {len(submitted)} jobs submitted in {submit_s:.1f} s", flush=True)
        cpu_before, cpu_t0 = cpu_by_process(stack, sims), time.monotonic()
        deadline = time.monotonic() + args.minutes * 60
        samples: list[tuple[float, int, int]] = []  # (t, running tasks, max point id)
        offline_seen = 0
        while time.monotonic() < deadline:
            running = Task.objects.filter(state="running").count()
            top = MetricPoint.objects.aggregate(m=Max("id"))["m"] or 0
            samples.append((time.monotonic(), running, top))
            offline_seen = max(offline_seen, Host.objects.filter(status=HostStatus.OFFLINE).count())
            if not Job.objects.filter(pk__in=submitted).exclude(state__in=TERMINAL_JOB_STATES).exists():
                break
            time.sleep(2)
        results["jobs phase, s"] = time.monotonic() - (deadline - args.minutes * 60)
        # Who used the machine's cores while the jobs ran (on a 2-core machine everything here shares them; a pass's
        # wall time over its CPU time is mostly what the others took): % of one core each, 200 = two cores full.
        results["CPU over the jobs phase, % of a core"] = cpu_shares(
            cpu_before, cpu_by_process(stack, sims), time.monotonic() - cpu_t0
        )
        jobs_phase = (submit_start + submit_s, time.time())
        results.update(queue_figures(list(submitted), *jobs_phase, args.hosts * 8))

        # Placement: each job's tasks of attempt 1 are created in one scheduler pass at job.placed_at.
        placed = list(
            Job.objects.filter(pk__in=submitted, placed_at__isnull=False)
            .annotate(n=Count("tasks"))
            .values_list("pk", "created_at", "placed_at", "n", "state")
        )
        times = handler_times(stack.orchestrator_logs())
        sched = times.get("orchestrator.schedule", [])
        watchdog = times.get("orchestrator.watchdog", [])
        total_tasks = sum(n for *_, n, _s in placed)
        # The first wave: what fitted the idle fleet, placed once the queue was committed; its rate is tasks over the
        # seconds from that commit to its last placement (the pass's start-up and the ask's trip included).
        first = sorted(placed, key=lambda r: r[2])
        wave = [r for r in first if r[2].timestamp() - (submit_start + submit_s) < 5]
        if wave:
            span = (wave[-1][2].timestamp() - (submit_start + submit_s)) or 1e-9
            results["first wave: tasks placed"] = sum(r[3] for r in wave)
            results["first wave: tasks placed/s (wall, from the queue's commit)"] = sum(r[3] for r in wave) / span
        sched_s = sum(sched) + sum(watchdog)
        results.update(head_promises(stack.orchestrator_logs(), list(submitted)))
        placing = placing_passes(stack.orchestrator_logs())
        if placing:
            biggest = max(placing)
            placed_tasks = sum(p.tasks for p in placing)
            wall, cpu, waiting = (sum(p.seconds for p in placing), sum(p.cpu for p in placing),
                                  sum(p.waiting for p in placing))  # fmt: skip
            results["placing passes / tasks they placed"] = (len(placing), placed_tasks)
            results["placement: tasks/s within passes that placed"] = placed_tasks / wall
            results["placement: tasks per CPU-second of those passes' threads"] = placed_tasks / max(cpu, 1e-9)
            # Where their wall time went: on a core, waiting for one (the machine's other processes), or blocked
            # (queries and the broker).
            results["placing passes' time: on a core / waiting for one / blocked, %"] = (
                100 * cpu / wall,
                100 * waiting / wall,
                100 * (wall - cpu - waiting) / wall,
            )
            results["placing pass p50 / p90, ms"] = (pct([p.seconds for p in placing], 50) * 1000,
                                                     pct([p.seconds for p in placing], 90) * 1000)  # fmt: skip
            results["largest pass: tasks, s, tasks/s"] = (biggest.tasks, biggest.seconds,
                                                          biggest.tasks / biggest.seconds)  # fmt: skip
        results["tasks placed in all"] = total_tasks
        results["tasks placed per second of scheduler time"] = total_tasks / sched_s if sched_s else float("nan")
        results["scheduler pass p50/p99, ms"] = (pct(sched, 50) * 1000, pct(sched, 99) * 1000)
        results["watchdog tick p50/p99/max, ms"] = (pct(watchdog, 50) * 1000, pct(watchdog, 99) * 1000,
                                                   max(watchdog, default=float("nan")) * 1000)  # fmt: skip
        # Ingest: points stored per second while at least 90% of the peak number of tasks ran.
        peak = max((s[1] for s in samples), default=0)
        busy = [s for s in samples if peak and s[1] >= 0.9 * peak]
        if len(busy) >= 2:
            results["ingest points/s"] = (busy[-1][2] - busy[0][2]) / (busy[-1][0] - busy[0][0])
            results["tasks reporting (mean while measured)"] = statistics.mean(s[1] for s in busy)
        results["peak running tasks"] = peak

        # Correctness.
        final = dict(Job.objects.filter(pk__in=submitted).values_list("pk", "state"))
        not_final = [pk for pk, state in final.items() if state not in TERMINAL_JOB_STATES]
        not_succeeded = [pk for pk, state in final.items() if state in TERMINAL_JOB_STATES and state != "succeeded"]
        per_job = Task.objects.filter(job__in=submitted).values("job").annotate(n=Count("id"))
        counts = dict(per_job.values_list("job", "n"))
        twice = [pk for pk, data in submitted.items() if counts.get(pk, 0) > expected_tasks(data)]
        attempts = list(Job.objects.filter(pk__in=submitted, attempt__gt=1).values_list("pk", flat=True))
        offline_log = sum(len(re.findall(r"host \S+ is offline", p.read_text(errors="replace")))
                          for p in stack.orchestrator_logs())  # fmt: skip
        results.update({"jobs not final": len(not_final), "jobs not succeeded": len(not_succeeded),
                        "jobs placed twice": len(twice) + len(attempts), "hosts marked offline": max(offline_log,
                        offline_seen)})  # fmt: skip
        if not_final and args.until_done:
            failures.append(f"{len(not_final)} job(s) not final after {args.minutes:g} min")
        if not_succeeded:
            failures.append(f"{len(not_succeeded)} job(s) did not succeed: {not_succeeded[:10]}")
        if twice or attempts:
            failures.append(f"job(s) placed more than once: {(twice + attempts)[:10]}")
        if results["hosts marked offline"]:
            failures.append("a healthy simulated host was marked offline")

        # Stop the fleet; submit -> launch order latencies from what the agents received.
        for proc in sims:
            proc.terminate()
        for proc in sims:
            proc.wait(30)
        launches: dict[int, float] = {}
        received: dict[int, float] = {}  # task id -> when its agent got the launch order
        ended: dict[int, float] = {}  # task id -> when its process ended at the agent
        tally: dict[str, int] = {}
        for out in var.glob("sim-*.json"):
            if out.name.endswith(".config.json"):
                continue
            data = json.loads(out.read_text())
            for key, value in data["tally"].items():
                tally[key] = tally.get(key, 0) + value
            for job_id, task_id, issued, got in data["launches"]:
                launches[job_id] = min(issued, launches.get(job_id, issued))
                received[task_id] = min(got, received.get(task_id, got))
            ended.update(data.get("exits", ()))
        created = {pk: at.timestamp() for pk, at, *_ in placed}
        # From when the queue was committed (all jobs were submitted in one transaction): nothing could be placed
        # before that.
        queued_at = submit_start + submit_s
        lat = [launches[pk] - max(created[pk], queued_at) for pk in launches if pk in created]
        wave_ids = {r[0] for r in wave}
        lat_wave = [launches[pk] - max(created[pk], queued_at) for pk in launches if pk in wave_ids]
        results["queued->launch order p50/p99, s (first wave)"] = (pct(lat_wave, 50), pct(lat_wave, 99))
        results["queued->launch order p50/p99, s (all, waiting included)"] = (pct(lat, 50), pct(lat, 99))
        results["fleet tally"] = tally
        results.update(booked_time(list(submitted), received, ended, jobs_phase))
        # The orchestrator's own claim, from its rows; what the agents saw also counts a stray process that was still
        # running when its host came back after being declared lost (it is killed on that host's next report).
        longest_pass = max([*sched, *watchdog, *(p.seconds for p in placing)], default=1.0)
        results["ports booked twice"], results["devices booked twice"] = booked_twice(list(submitted), longest_pass)
        results["seen at the agents: ports / devices in use at a launch"] = (
            tally.get("ports booked twice", 0),
            tally.get("devices booked twice", 0),
        )
        if results["ports booked twice"] or results["devices booked twice"]:
            failures.append("the orchestrator booked a port or device twice")
        if tally.get("refused"):
            failures.append(f"{tally['refused']} order(s) refused by the simulated agents' OrderGate")

        # 2b. the ingest with --ingest-tasks tasks reporting at 1 Hz: the mixed queue above seldom has that many
        # running at once (strict FIFO drains the fleet for its wide jobs), so running tasks are written directly,
        # --ingest-tasks / --hosts per host, and this process reports their metrics as their agents would (sealed
        # with each host's key, one entry per task per second, on the real stream); the ingest stores them.
        if args.ingest_tasks:
            results.update(ingest_phase(fleet, args.ingest_tasks, args.ingest_s, stack.env["REDIS_URL"]))
            print(f"[scale] ingest: {results['ingest at full fleet: points stored/s']:.0f} points/s", flush=True)

        # 3. pages at --page-jobs jobs.
        fill_history(args.page_jobs)
        widest = max(placed, key=lambda r: r[3])[0] if placed else Job.objects.order_by("-pk").first().pk
        pages = page_latencies(f"http://127.0.0.1:{stack.web_port}", widest, args.page_loads)
        for name, values in pages.items():
            results[f"{name} p50/p95, ms ({Job.objects.count()} jobs)"] = (pct(values, 50), pct(values, 95))
    finally:
        for proc in sims:
            if proc.poll() is None:
                proc.kill()
        stack.stop_all()
    results["load at end"] = os.getloadavg()
    results["bench wall time, s"] = time.monotonic() - wall_start
    results["failures"] = failures
    _print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    if args.keep:
        print(f"[scale] kept {var}")
    else:
        shutil.rmtree(var, ignore_errors=True)
    if failures:
        print("[scale] FAILED: " + "; ".join(failures))
    return 1 if failures else 0


def _print_table(results: dict[str, Any]) -> None:
    width = max(len(k) for k in results)
    print("\n" + "-" * (width + 30))
    for key, value in results.items():
        if isinstance(value, float):
            text = f"{value:,.1f}"
        elif isinstance(value, tuple | list) and value and all(isinstance(v, float) for v in value):
            text = " / ".join(f"{v:,.2f}" for v in value)
        else:
            text = str(value)
        print(f"{key:<{width}}  {text}")
    print("-" * (width + 30), flush=True)


if __name__ == "__main__":
    sys.exit(main())
