"""Chaos soak: the whole product on this machine, with its parts SIGKILLed at random, and then the truth checked.

    .venv/bin/python bench/chaos.py [--minutes 10] [--fault-every 8] [--seed N] [--faults agent,task] [--json FILE]
                                    [--planes 2]

A stack of its own under a temporary folder: an embedded PostgreSQL and an embedded Redis (append-only file) on free
ports, the web server, the orchestrator (Celery worker + beat), the scheduler's worker, the metrics ingest and three
agents. For `--minutes` it keeps a stream of mixed jobs in flight (all three strategies, user scripts and a built-in TF
program, jobs that fail, jobs cancelled midway, restart policies on) while a monkey SIGKILLs, every few seconds, one
of: an agent, a task process, the orchestrator, the scheduler, the ingest, the web server, Redis, PostgreSQL, and
starts it again (task processes are the product's to restart). With `--planes 2` every control-plane process runs
twice, as on two machines (docs/operations/two-control-planes.md), and one more fault kills a whole control plane's
processes at once (`plane`: the one whose scheduler holds the lease), each such takeover measured: how long until the
other plane holds the scheduler and beat leases, and until a job submitted at the kill is placed (that includes any
wait for free devices). Then it stops the faults, waits for every job to end, and checks:

- every job final, its tasks final and consistent with how their processes ended (`events lost`: a task whose
  process recorded its own exit code, under an agent that lived through it, stored with another);
- no task in an active state (`stuck tasks`), no task process alive (`orphans`), no port of the hosts' ranges held;
- every log line and metric point a task printed (the soak scripts number them and keep a ground-truth file)
  stored exactly once (`lost` / `duplicated`);
- no two live tasks ever on one host's port or device (`double bookings`, sampled every half second all along).

A task's output goes to files first and a restarted agent reads them on from where its predecessor had got to, so
every task's lines are checked, those of tasks that ran under a killed agent included. Its metric points still travel
through a pipe that ends with the agent: the points of tasks under a killed agent (`under a killed agent`) are left
out of the point counts. Prints the table; exits 1 when an invariant does not hold.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from stack import Stack, with_retry

PY = sys.executable
HOSTS = 3

# One soak program for every role: numbered lines and points, a ground-truth file, then its exit code. Like TF, a
# task of a multi-process job listens on its TF_CONFIG port, and a ParameterServer ps or worker serves until stopped.
SOAK_SCRIPT = b"""
import json, os, socket, sys, time
truth_dir, lines, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
me = f"{os.environ['TFDASH_TASK_ID']}-{os.environ['TFDASH_ATTEMPT']}"
config = json.loads(os.environ.get("TF_CONFIG") or "{}")
task = config.get("task", {})
serves = "chief" in config.get("cluster", {}) and task.get("type") in ("ps", "worker")
if task:  # every task of a multi-process job opens its port, as TF's server does
    port = int(config["cluster"][task["type"]][task["index"]].rsplit(":", 1)[1])
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen()
metrics = os.fdopen(int(os.environ["TFDASH_METRICS_FD"]), "w", buffering=1)
truth = open(os.path.join(truth_dir, me), "a", buffering=1)
i = 0
while serves or i < lines:
    print(f"line {i}", flush=True)
    point = {"kind": "metric", "ts": time.time(), "mono": time.monotonic(), "step": i, "epoch": None,
             "phase": "train", "metrics": {"loss": 1.0 / (i + 1)}}
    metrics.write(json.dumps(point) + "\\n")
    metrics.flush()
    truth.write(f"{i}\\n")
    i += 1
    time.sleep(0.5 if serves else 0.1)
truth.write(f"exit {code}\\n")
sys.exit(code)
"""


# --- the workload ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    name: str
    weight: int
    shape: dict[str, Any]
    lines: int = 40
    code: int = 0
    cancel_after_s: float | None = None
    builtin: str = ""


KINDS = [
    Kind("mirrored script", 3, {"strategy": "mirrored", "workers": 1, "devices_per_worker": 1}),
    Kind("mirrored script that fails", 1, {"strategy": "mirrored", "workers": 1, "devices_per_worker": 1}, code=3),
    Kind("multi-worker script", 3, {"strategy": "multi_worker_mirrored", "workers": 2, "devices_per_worker": 1}),
    Kind("parameter-server script", 2, {"strategy": "parameter_server", "workers": 2, "ps": 1,
                                        "devices_per_worker": 1}),
    Kind("multi-worker script, cancelled", 1, {"strategy": "multi_worker_mirrored", "workers": 2,
                                               "devices_per_worker": 1}, lines=400, cancel_after_s=6),
    Kind("built-in digits_mlp", 1, {"strategy": "mirrored", "workers": 1, "devices_per_worker": 1},
         builtin="digits_mlp"),
]  # fmt: skip


@dataclass
class Tally:
    faults: Counter[str] = field(default_factory=Counter)
    agent_kills: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    jobs: dict[int, Kind] = field(default_factory=dict)
    cancelled: set[int] = field(default_factory=set)
    takeovers: list[dict[str, Any]] = field(default_factory=list)  # one per plane killed or cut off
    double_bookings: int = 0
    bookings_sampled: int = 0


class Workload:
    def __init__(self, truth: Path, tally: Tally, rng: random.Random) -> None:
        from django.contrib.auth import get_user_model

        self.truth = truth
        self.tally = tally
        self.rng = rng
        self.owner = with_retry("user", lambda: get_user_model().objects.get_or_create(username="chaos")[0])

    def submit(self, kind: Kind | None = None) -> int:
        from orchestrator.models import Cluster
        from orchestrator.submit import submission

        kind = kind or self.rng.choices(KINDS, weights=[k.weight for k in KINDS])[0]
        data: dict[str, Any] = {"name": kind.name, "max_restarts": 2, **kind.shape}
        upload = None
        if kind.builtin:
            data |= {"builtin": kind.builtin, "builtin_config": {"epochs": 2, "steps_per_epoch": 20}}
        else:
            data["args"] = [str(self.truth), str(kind.lines), str(kind.code)]
            upload = submission.Upload(filename="soak.py", content=SOAK_SCRIPT)

        def submit() -> int:
            cluster = Cluster.objects.get(name="local")
            job, _ = submission.new_job(self.owner, cluster, data)
            return submission.submit(job, upload).pk

        job_id = with_retry("submit", submit)
        self.tally.jobs[job_id] = kind
        return job_id

    def in_flight(self) -> list[int]:
        from orchestrator.models import TERMINAL_JOB_STATES, Job

        return with_retry(
            "jobs", lambda: list(Job.objects.exclude(state__in=TERMINAL_JOB_STATES).values_list("pk", flat=True))
        )

    def cancel_due(self) -> None:
        from orchestrator.jobs import lifecycle
        from orchestrator.models import Job, JobState

        # A copy: the monkey's takeover probes (Monkey, its own thread) submit jobs into the tally meanwhile.
        for job_id, kind in list(self.tally.jobs.items()):
            if kind.cancel_after_s is None or job_id in self.tally.cancelled:
                continue
            job = with_retry("job", lambda job_id=job_id: Job.objects.get(pk=job_id))
            placed = job.placed_at.timestamp() if job.placed_at else None
            if (
                job.state in (JobState.STARTING, JobState.RUNNING)
                and placed
                and time.time() - placed > kind.cancel_after_s
            ):
                with_retry("cancel", lambda job_id=job_id: lifecycle.cancel(job_id, "the chaos soak"))
                self.tally.cancelled.add(job_id)


# --- the monkey ------------------------------------------------------------------------------------------------------
SERVICES = ["orchestrator", "scheduler", "ingest", "web", "redis", "postgres"]


class Monkey(threading.Thread):
    def __init__(
        self, stack: Stack, tally: Tally, rng: random.Random, every_s: float, victims: list[str] | None = None
    ) -> None:
        super().__init__(name="monkey", daemon=True)
        self.victims = victims or [*SERVICES, "agent", "task", "task"]
        self.stack = stack
        self.tally = tally
        self.rng = rng
        self.every_s = every_s
        self.stopped = threading.Event()
        self.truth = Path()  # where soak tasks write their ground truth (set by main, for the probe jobs)
        self.takeovers: list[threading.Thread] = []

    def run(self) -> None:
        try:
            self._run()
        finally:
            for thread in self.takeovers:
                thread.join()

    def _run(self) -> None:
        while not self.stopped.wait(self.rng.uniform(0.5, 1.5) * self.every_s):
            victim = self.rng.choice(self.victims)
            if victim == "plane":
                if self.stack.planes == 2:
                    self._kill_a_plane()
                continue
            if victim == "partition":
                if self.stack.planes == 2 and self.stack.plane_netns:
                    self._cut_a_plane()
                continue
            if victim == "task":
                pid = self._a_task_process()
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    self.tally.faults["task process"] += 1
                continue
            name = f"agent-{self.rng.choice(list(self.stack.agents))}" if victim == "agent" else victim
            self.stack.kill(name)
            if victim == "agent":
                self.tally.agent_kills[name.removeprefix("agent-")].append(time.time())
            self.tally.faults[victim] += 1
            # Down for a moment: long enough for clients to notice, short of the 15 s heartbeat timeout.
            if self.stopped.wait(self.rng.uniform(1, 3)):
                self.stack.start(name)
                return
            self.stack.start(name)

    def _kill_a_plane(self) -> None:
        """SIGKILL every process of the control plane whose scheduler holds the lease, measure the other's takeover,
        start the killed one again a moment later (it comes back as the standby)."""
        plane, pids, held = self._acting_plane()
        killed_at = time.time()
        self.stack.kill_plane(plane)
        self.tally.faults["plane"] += 1
        probe = Workload(self.truth, self.tally, self.rng).submit(KINDS[0])  # a small job, to time its placement
        self.takeovers.append(
            threading.Thread(target=self._measure, args=(killed_at, pids, held, probe), name="takeover", daemon=True)
        )
        self.takeovers[-1].start()
        self.stopped.wait(self.rng.uniform(1, 3))
        for name in self.stack.control_plane(plane):
            self.stack.start(name)

    def _acting_plane(self, bound_s: float = 60) -> tuple[str, set[int], list[str]]:
        """The plane whose scheduler holds its lease ("" or "b"), that plane's process ids and the leases it holds
        (the beat's may be the other plane's already), once the scheduler's lease has a holder: a fault due while no
        plane held it (the last takeover not done yet) waits for it, or it would hit a plane acting for nothing and
        measure no takeover (a clean-clone run: a kill whose takeover had only "job placed", no "scheduler")."""
        from orchestrator.leases import store

        deadline = time.time() + bound_s
        while True:
            holders = {h.name: h.holder for h in with_retry("leases", store.read_all) if h.live}
            if store.SCHEDULER in holders or time.time() > deadline or self.stopped.wait(0.5):
                break
        plane = "b" if "scheduler-b@" in holders.get(store.SCHEDULER, "") else ""
        pids = _process_tree_pids([self.stack.children[name].proc.pid for name in self.stack.control_plane(plane)])
        return plane, pids, [name for name, holder in holders.items() if _pid_of(holder) in pids]

    def _cut_a_plane(self) -> None:
        """Cut the acting control plane off the network (its namespace's link down) for longer than a lease, its
        processes running on, then mend it: the other plane takes over, the cut one must stop acting by itself and
        stay the standby once back (a holder that lost its lease never acts on it)."""
        plane, pids, held = self._acting_plane()
        link = ["ip", "netns", "exec", self.stack.plane_netns[plane], "ip", "link", "set", "eth0"]
        cut_at = time.time()
        subprocess.run([*link, "down"], check=True, timeout=30)
        self.tally.faults["partition"] += 1
        probe = Workload(self.truth, self.tally, self.rng).submit(KINDS[0])
        self.takeovers.append(
            threading.Thread(target=self._measure, args=(cut_at, pids, held, probe, "plane cut off"), daemon=True)
        )
        self.takeovers[-1].start()
        self.stopped.wait(self.rng.uniform(25, 30))  # past the lease (15 s) and the other's takeover
        subprocess.run([*link, "up"], check=True, timeout=30)

    def _measure(
        self, killed_at: float, dead: set[int], held: list[str], probe: int, what: str = "plane killed",
        bound_s: float = 180,
    ) -> None:  # fmt: skip
        from orchestrator.leases import store
        from orchestrator.models import Job

        took: dict[str, float | None] = {**dict.fromkeys(held), "job placed": None}
        while time.time() - killed_at < bound_s and None in took.values():
            for lease in with_retry("leases", store.read_all):
                if took.get(lease.name, 0.0) is None and lease.live and _pid_of(lease.holder) not in dead:
                    took[lease.name] = max(0.0, time.time() - killed_at)
            placed = with_retry("probe", lambda: Job.objects.filter(pk=probe).values_list("placed_at", flat=True)[0])
            if took["job placed"] is None and placed is not None:
                took["job placed"] = max(0.0, placed.timestamp() - killed_at)
            time.sleep(0.2)
        print(f"[chaos] {what}: " + ", ".join(f"{name} after {_secs(s)}" for name, s in took.items()) + " (the "
              "leases it held taken over; a job submitted then placed)", flush=True)  # fmt: skip
        self.tally.takeovers.append({"fault": what, **took})

    def _a_task_process(self) -> int | None:
        leaders = [p.pid for p in _task_processes(self.stack.var) if _is_leader(p)]
        return self.rng.choice(leaders) if leaders else None


def _task_processes(var: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if (proc.info["environ"] or {}).get("TFDASH_TASK_ID") and str(var) in " ".join(proc.info["cmdline"]):
                found.append(proc)
    return found


def _is_leader(proc: psutil.Process) -> bool:
    try:
        return os.getpgid(proc.pid) == proc.pid
    except OSError:
        return False


def _process_tree_pids(roots: list[int]) -> set[int]:
    pids = set(roots)
    for root in roots:
        with contextlib.suppress(psutil.Error):
            pids.update(child.pid for child in psutil.Process(root).children(recursive=True))
    return pids


def _pid_of(holder: str) -> int | None:
    """The pid in a lease holder's name (orchestrator/leases/store.py identity: NAME:PID:NONCE)."""
    try:
        return int(holder.rsplit(":", 2)[1])
    except (IndexError, ValueError):
        return None


def _secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


class BookingWatch(threading.Thread):
    """Every half second, all along: live tasks (pending to stopping) that share a host's port or device."""

    def __init__(self, tally: Tally) -> None:
        super().__init__(name="bookings", daemon=True)
        self.tally = tally
        self.stopped = threading.Event()

    def run(self) -> None:
        from django.db import DatabaseError, close_old_connections

        from orchestrator.models import ACTIVE_TASK_STATES, Task

        while not self.stopped.wait(0.5):
            try:
                live = list(
                    Task.objects.filter(state__in=ACTIVE_TASK_STATES, host__isnull=False).values_list(
                        "pk", "host_id", "port", "devices"
                    )
                )
            except DatabaseError:  # PostgreSQL killed by the monkey: sample again once it is back
                close_old_connections()
                continue
            ports = Counter((host, port) for _pk, host, port, _devices in live if port)
            devices = Counter((host, str(device)) for _pk, host, _port, ds in live for device in ds or ())
            doubled = [key for key, n in (ports | devices).items() if n > 1]
            self.tally.bookings_sampled += 1
            if doubled:
                self.tally.double_bookings += len(doubled)
                print(f"  double booking: {doubled} among {live}", flush=True)


# --- the checks ------------------------------------------------------------------------------------------------------
def check(stack: Stack, truth: Path, tally: Tally) -> dict[str, int]:
    from contracts.strategies import speaks_for_job
    from orchestrator.models import ACTIVE_TASK_STATES, Job, JobState, MetricPoint, Task, TaskLogLine

    jobs = {job.pk: job for job in Job.objects.all()}
    tasks = list(Task.objects.select_related("host"))
    counts: dict[str, int] = Counter()
    counts["jobs submitted"] = len(jobs)
    counts["jobs not final"] = sum(not job.is_terminal for job in jobs.values())
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        counts[f"jobs {state}"] = sum(job.state == state for job in jobs.values())
    counts["stuck tasks"] = sum(task.state in ACTIVE_TASK_STATES for task in tasks)
    counts["orphans"] = len(_task_processes(stack.var))
    counts["ports held"] = _ports_held(stack)
    counts["jobs inconsistent"] = 0
    for job in jobs.values():
        if job.state == JobState.SUCCEEDED and job.strategy != "parameter_server":
            speaker = speaks_for_job(job.strategy)
            if not any(
                (t.type, t.index) == speaker and t.exit_code == 0 and t.job_id == job.pk and t.attempt == job.attempt
                for t in tasks
            ):
                counts["jobs inconsistent"] += 1
    lines = defaultdict(Counter)
    for task_id, text in TaskLogLine.objects.values_list("task_id", "text"):
        if text.startswith("line "):
            lines[task_id][int(text.split()[1])] += 1
    points = defaultdict(Counter)
    for task_id, step in MetricPoint.objects.filter(name="loss", phase="train").values_list("task_id", "step"):
        points[task_id][step] += 1
    for key in ("events lost", "log lines lost", "log lines duplicated", "points lost", "points duplicated",
                "tasks under a killed agent", "tasks on a host declared offline", "tasks checked"):  # fmt: skip
        counts[key] = 0
    for task in tasks:
        recorded = _truth(truth / f"{task.pk}-{task.attempt}")
        if recorded is None:
            continue  # a built-in program, or a soak task that never started
        printed, exit_code = recorded
        under_killed_agent = _under_killed_agent(task, tally)
        counts["tasks under a killed agent"] += under_killed_agent
        counts["tasks checked"] += 1
        # The watchdog's verdict on a host whose heartbeats stopped arriving in time (a loaded machine) ends its
        # tasks as lost before their exits arrive: the liveness policy at work, not a lost event. Counted apart.
        judged_lost = task.state == "lost" and "stopped answering" in task.detail
        counts["tasks on a host declared offline"] += judged_lost
        if (
            not judged_lost
            and not under_killed_agent  # its new agent reclaimed it: its exit code is unknown (a lost task)
            and exit_code is not None
            and task.exit_code != exit_code
            and not (task.exit_code or 0) < 0
        ):
            counts["events lost"] += 1
            print(f"  task {task.pk}: exited {exit_code}, stored {task.state} {task.exit_code}: {task.detail}")
        for name, stored in (("log lines", lines[task.pk]), ("points", points[task.pk])):
            if name == "points" and under_killed_agent:
                continue  # the metrics pipe ended with the agent
            # A process killed between printing a line and writing its truth has one more stored than written.
            lost = sum(1 for i in range(printed) if stored[i] == 0)
            counts[f"{name} lost"] += lost
            counts[f"{name} duplicated"] += sum(n - 1 for n in stored.values() if n > 1)
            if lost:
                print(f"  task {task.pk} ({task.state}): {lost} of {printed} {name} missing")
    return counts


def _truth(path: Path) -> tuple[int, int | None] | None:
    if not path.exists():
        return None
    printed, code = 0, None
    for line in path.read_text().splitlines():
        if line.startswith("exit "):
            code = int(line.split()[1])
        elif line.strip():
            printed = max(printed, int(line) + 1)
    return printed, code


def _under_killed_agent(task: Any, tally: Tally) -> bool:
    # From the attempt's placement, not its started_at: that is when the control plane applied the start event, which
    # an agent killed right after the launch delivers only from its next life (a soak beside stress-ng: placed
    # 15:23:20, the agent killed at :23 with the task's pipe, started_at 15:24:12; its lost points counted as lost).
    began = task.placed_at or task.started_at
    if task.host is None or began is None:
        return False
    start = began.timestamp() - 2
    end = (task.finished_at.timestamp() if task.finished_at else time.time()) + 2
    return any(start <= at <= end for at in tally.agent_kills.get(task.host.name, []))


def _ports_held(stack: Stack) -> int:
    """Sockets listening on a port of the hosts' ranges (a task's TF server, or anything else that took one)."""
    ranges = [tuple(map(int, agent["port_range"].split("-"))) for agent in stack.agents.values()]
    return sum(
        1
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and any(low <= conn.laddr.port <= high for low, high in ranges)
    )


# --- main ------------------------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--fault-every", type=float, default=8.0, help="seconds between faults, on average")
    parser.add_argument("--in-flight", type=int, default=3, help="jobs kept queued or running")
    parser.add_argument("--settle", type=float, default=300, help="seconds to wait for every job to end afterwards")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--faults",
        type=lambda text: text.split(","),
        default=None,
        help=f"the parts to kill, comma-separated, of {','.join([*SERVICES, 'agent', 'task', 'plane', 'partition'])} "
        "(default: all; plane: a whole control plane, with --planes 2; partition: its network cut, with --plane-netns)",
    )
    parser.add_argument("--planes", type=int, choices=(1, 2), default=1, help="control planes to run (default 1)")
    parser.add_argument(
        "--plane-netns",
        type=lambda text: text.split(","),
        default=None,
        help="each control plane's network namespace, comma-separated (made beforehand: tests/support/netns.py)",
    )
    parser.add_argument(
        "--bind", default="127.0.0.1", help="PostgreSQL and Redis listen here too (the namespaces' bridge)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, data); kept on a failure")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    rng = random.Random(seed)
    var = Path(tempfile.mkdtemp(prefix="tfdash-chaos-"))
    os.chmod(var, 0o755)  # noqa: S103 - the embedded PostgreSQL runs as its own user when we are root
    # In the cluster's shared folder: as root, a task's /tmp is its own, and the agents' shared root is what it sees.
    (var / "shared").mkdir()
    truth = var / "shared" / "truth"
    truth.mkdir(mode=0o777)
    os.chmod(truth, 0o777)  # noqa: S103 - task processes write their ground truth here
    stack = Stack(var, planes=args.planes, plane_netns=args.plane_netns, bind=args.bind)
    tally = Tally()
    watch = BookingWatch(tally)
    print(f"[chaos] seed {seed}; stack under {var}", flush=True)
    monkey = None
    try:
        stack.set_up_django()
        stack.start_local_cluster(hosts=HOSTS, first_port=_free_port_block())
        _wait_online(len(stack.agents))
        _wait_leases(stack)
        where = f" in network namespaces {', '.join(args.plane_netns)}" if args.plane_netns else ""
        print(f"[chaos] stack up ({args.planes} control plane(s){where}); soaking {args.minutes:g} min with a fault "
              f"every ~{args.fault_every:g} s", flush=True)  # fmt: skip

        workload = Workload(truth, tally, rng)
        victims = args.faults or [
            *SERVICES,
            "agent",
            "task",
            "task",
            *(["plane"] if args.planes == 2 else []),
            *(["partition"] if args.plane_netns else []),
        ]
        monkey = Monkey(stack, tally, rng, args.fault_every, victims)
        monkey.truth = truth
        watch.start()
        monkey.start()
        soak_end = time.monotonic() + args.minutes * 60
        while time.monotonic() < soak_end:
            if len(workload.in_flight()) < args.in_flight:
                workload.submit()
            workload.cancel_due()
            time.sleep(0.5)
        monkey.stopped.set()
        monkey.join()
        for name in list(stack.children):
            if not stack.alive(name):
                stack.start(name)
        print(f"[chaos] soak over: {sum(tally.faults.values())} faults; waiting for every job to end", flush=True)
        deadline = time.monotonic() + args.settle
        while workload.in_flight() and time.monotonic() < deadline:
            workload.cancel_due()
            time.sleep(1)
        _settle_tasks(deadline)
        _settle_processes(stack)
        watch.stopped.set()
        watch.join()
        counts = check(stack, truth, tally)
        counts["double bookings"] = tally.double_bookings
        counts["booking samples"] = tally.bookings_sampled
    finally:
        watch.stopped.set()
        if monkey is not None:
            monkey.stopped.set()
        stack.stop_all()
    results: dict[str, Any] = {"seed": seed, "minutes": args.minutes, "faults": dict(tally.faults), **counts}
    if tally.takeovers:
        results["takeovers"] = tally.takeovers
    _print_table(results)
    failed = [key for key in INVARIANTS if results.get(key)]
    if args.json:
        args.json.write_text(json.dumps({**results, "invariants": list(INVARIANTS), "failed": failed}, indent=2))
    if args.keep or failed:  # a failure keeps its evidence: every part's log under log/, the data, the truth files
        print(f"[chaos] kept {var}")
    else:
        shutil.rmtree(var, ignore_errors=True)
    if failed:
        print(f"[chaos] FAILED: {', '.join(failed)}")
    return 1 if failed else 0


INVARIANTS = ("jobs not final", "jobs inconsistent", "stuck tasks", "orphans", "ports held", "events lost",
              "log lines lost", "log lines duplicated", "points lost", "points duplicated",
              "double bookings")  # fmt: skip


def _wait_leases(stack: Stack, timeout_s: float = 90) -> None:
    """Each single actor (beat, scheduler) has a live holder: one plane acts, the other stands by."""
    from orchestrator.leases import store

    deadline = time.monotonic() + timeout_s
    while {h.name for h in with_retry("leases", store.read_all) if h.live} != set(store.NAMES):
        if time.monotonic() > deadline:
            raise SystemExit(f"no holder of every lease within {timeout_s:g} s; see {stack.logs}")
        time.sleep(0.5)


def _wait_online(hosts: int) -> None:
    from orchestrator.models import Host, HostStatus

    deadline = time.monotonic() + 90
    while with_retry("hosts", lambda: Host.objects.filter(status=HostStatus.ONLINE).count()) < hosts:
        if time.monotonic() > deadline:
            raise SystemExit("the agents did not come online within 90 s")
        time.sleep(0.5)


def _settle_tasks(deadline: float) -> None:
    """After the jobs: their last tasks are stopped (ParameterServer servers, a gang's stragglers)."""
    from orchestrator.models import ACTIVE_TASK_STATES, Task

    while time.monotonic() < deadline:
        if not with_retry("tasks", lambda: Task.objects.filter(state__in=ACTIVE_TASK_STATES).exists()):
            return
        time.sleep(1)


def _settle_processes(stack: Stack, bound_s: float = 30) -> None:
    """Processes of tasks that are final by now (a stray an agent was told to kill after its task was declared lost)
    go within a few heartbeats and a kill grace: give them that bound before they count as orphans."""
    deadline = time.monotonic() + bound_s
    while (_task_processes(stack.var) or _ports_held(stack)) and time.monotonic() < deadline:
        time.sleep(0.5)


def _print_table(results: dict[str, Any]) -> None:
    faults = results["faults"]
    print(f"\nchaos soak: {results['minutes']:g} min, seed {results['seed']}")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(faults.items()))
    print(f"  {'faults injected':<28} {sum(faults.values()):>6}  ({kinds})")
    for key, value in results.items():
        if key in ("seed", "minutes", "faults", "takeovers"):
            continue
        mark = "  <-- must be 0" if key in INVARIANTS and value else ""
        print(f"  {key:<28} {value:>6}{mark}")
    for i, took in enumerate(results.get("takeovers", []), 1):
        print(
            f"  {took['fault']} ({i}): " + ", ".join(f"{k} after {_secs(s)}" for k, s in took.items() if k != "fault")
        )


def _free_port_block(size: int = HOSTS * 100) -> int:
    """The first of `size` free ports in a row, for the hosts' TF port ranges (checked, not reserved), below the
    kernel's range for outgoing connections (whose local ports would look taken)."""
    rng = random.Random()
    for _ in range(50):
        low = rng.randrange(10000, 20000)
        if all(_bindable(port) for port in range(low, low + size)):
            return low
    raise SystemExit("no block of free ports for the hosts")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))  # noqa: S104 - probing
        except OSError:
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())
