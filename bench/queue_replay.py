"""The scheduler's policy without the control plane's latency: bench/scale.py's job mix replayed through the real
planner (orchestrator/core: backfill.Planner, placement) in simulated time, no database, agents or broker.

    .venv/bin/python bench/queue_replay.py [--seeds 21,22,23] [--hosts 500] [--jobs 1000] [--minutes 4]
                                           [--duration 20 60] [--policies fifo,backfill,easy] [--packings spread,pack]
                                           [--interval S] [--launch S] [--release S] [--margin S]

Every job is queued at time 0 (as bench/scale.py commits its queue in one transaction) with the same shapes, true run
times (drawn from --duration by job id) and time limits (1.5-5x the true time, from seed + 1) as bench/scale.py gives
the same seed and --duration. A pass runs at 0 and at every job's end; a started job holds its devices for its true
run time. `fifo` stops at the first job that does not fit; `backfill` reserves for 8 jobs (TFDASH_BACKFILL_DEPTH's
default); `easy` for the head only (depth 1). Prints, per seed, policy and packing: jobs finished within --minutes,
GPU utilization over that window and while jobs waited (to the last start), how long the queue was non-empty, mean
wait, and the reserved jobs that started after their first reservation (backfill's promise; must be 0 here, where
every run ends by its limit). What bench/scale.py measures beyond these figures is the control plane's own latency;
`--interval`, `--launch`, `--release` and `--margin` model it (class Lag), so a latency bench/scale.py reports can be
priced in utilization here, one at a time. Every figure is taken over the window: the replay stops at its end.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scale import DURATION, drawn_limit, job_mix, true_run_time  # noqa: E402 - bench/scale.py (a script's folder is on its path)

from contracts.strategies import Strategy  # noqa: E402
from orchestrator.core import backfill, backfill_terms, placement, scheduler_policy  # noqa: E402
from orchestrator.core.assignment import Packing  # noqa: E402
from orchestrator.core.hosts import HostState  # noqa: E402
from orchestrator.core.placement import Placement  # noqa: E402
from orchestrator.core.shapes import JobShape  # noqa: E402

# The product's policies (orchestrator/core/scheduler_policy.py), and `easy`: backfill reserving for the head only.
POLICIES = {
    **scheduler_policy.POLICIES,
    "easy": dataclasses.replace(scheduler_policy.POLICIES["backfill"], name="easy", depth=1),
}


@dataclasses.dataclass(frozen=True)
class Lag:
    """The control plane's latencies, modelled (all 0: the policy alone). `interval`: passes begin at most this often
    (TFDASH_SCHEDULE_INTERVAL_S); `launch`: placement -> the process runs; `release`: the process ends -> its devices
    are free to the next pass; `margin`: added to every time limit the planner is given (the scheduler's
    release_margin: stop grace + interval)."""

    interval: float = 0.0
    launch: float = 0.0
    release: float = 0.0
    margin: float = 0.0


DEVICES_PER_HOST = 8


def fleet(hosts: int) -> list[HostState]:
    return [
        HostState(name=f"sim-{i:04d}", address=f"10.{i // 250}.{i % 250}.1", port_min=20000, port_max=20099,
                  device_ids=tuple(range(DEVICES_PER_HOST)), gpu=True, labels=frozenset(), online=True,
                  used_devices=frozenset(), used_ports=frozenset())
        for i in range(hosts)
    ]  # fmt: skip


def release(states: list[HostState], where: Placement) -> list[HostState]:
    ports: dict[str, set[int]] = {}
    devices: dict[str, set[int]] = {}
    for task in where.tasks:
        ports.setdefault(task.host, set()).add(task.port)
        devices.setdefault(task.host, set()).update(task.devices)
    return [
        dataclasses.replace(state, used_ports=state.used_ports - ports[state.name],
                            used_devices=state.used_devices - devices.get(state.name, set()))
        if state.name in ports
        else state
        for state in states
    ]  # fmt: skip


def replay(
    seed: int,
    policy: str,
    packing: Packing,
    *,
    hosts: int,
    jobs: int,
    window: float,
    duration: tuple[float, float] = DURATION,
    lag: Lag | None = None,
) -> dict[str, Any]:
    lag = lag or Lag()
    limits = random.Random(seed + 1)
    queue = []
    for job_id, shape in enumerate(job_mix(jobs, random.Random(seed), gpus=hosts * DEVICES_PER_HOST), start=1):
        job_shape = JobShape(Strategy(shape["strategy"]), shape["workers"], shape.get("ps", 0),
                             shape["devices_per_worker"])  # fmt: skip
        queue.append((job_id, job_shape, true_run_time(job_id, duration), drawn_limit(job_id, duration, limits)))
    states = fleet(hosts)
    now, ends = 0.0, []  # ends: (time, job id)
    running: dict[int, tuple[float, Placement]] = {}  # job id -> (limit's end, placement)
    started: dict[int, float] = {}
    first_reserved: dict[int, float] = {}
    reservations: dict[int, backfill_terms.Reservation] = {}
    ran: list[tuple[float, float, int]] = []  # (process start, process end, devices): utilization counts these
    queue_empty_at: float | None = None
    last_pass = float("-inf")
    while True:
        last_pass = now
        planner = backfill.Planner(
            states,
            [backfill_terms.Running(pk, end, backfill_terms.devices_of(where)) for pk, (end, where) in running.items()],
            now=now, depth=POLICIES[policy].reservations(), take=placement.take, previous=reservations, packing=packing,
        )  # fmt: skip
        waiting = []
        for n, (job_id, shape, runs, limit) in enumerate(queue):
            where = planner.offer(backfill_terms.Waiting(job_id, shape, float(limit) + lag.margin))
            if isinstance(where, Placement):
                started[job_id] = now
                running[job_id] = (now + limit + lag.margin, where)
                ran.append((now + lag.launch, now + lag.launch + runs, sum(len(t.devices) for t in where.tasks)))
                heapq.heappush(ends, (now + lag.launch + runs + lag.release, job_id))
                continue
            waiting.append(queue[n])
            if POLICIES[policy].holds_back and job_id not in planner.outcome.never:
                waiting.extend(queue[n + 1 :])
                break
        planner.finish(plan_all=True)
        reservations = planner.outcome.reservations
        for job_id, reservation in reservations.items():
            first_reserved.setdefault(job_id, reservation.start)
        states, queue = planner.states, waiting
        if not queue and queue_empty_at is None:
            queue_empty_at = now
        if not ends or now >= window:  # what happens after the window counts for nothing measured
            break
        # Every end up to the next pass, then one pass (as the orchestrator's passes after exits, at most one per
        # interval).
        now = max(ends[0][0], last_pass + lag.interval)
        while ends and ends[0][0] <= now:
            _at, job_id = heapq.heappop(ends)
            states = release(states, running.pop(job_id)[1])
    waited_until = queue_empty_at if queue_empty_at is not None else window
    busy = sum(n * max(0.0, min(hi, window) - lo) for lo, hi, n in ran if lo < window)
    until = min(waited_until, window)
    busy_waiting = sum(n * max(0.0, min(hi, until) - lo) for lo, hi, n in ran if lo < until)
    finished = sum(1 for _lo, hi, _n in ran if hi <= window)
    capacity = hosts * DEVICES_PER_HOST
    late = [pk for pk, start in started.items() if pk in first_reserved and start > first_reserved[pk] + 1e-6]
    return {
        "finished": finished,
        "util %": busy / (capacity * window) * 100,
        "util while waiting %": busy_waiting / (capacity * min(waited_until, window)) * 100 if waited_until else 0.0,
        "queue non-empty s": waited_until,
        "wait mean s": statistics.fmean(min(started.get(j, window), window) for j in range(1, jobs + 1)),
        "reserved late / reserved": (len(late), len(first_reserved)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="21,22,23")
    parser.add_argument("--hosts", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--duration", type=float, nargs=2, default=DURATION, help="true run times drawn, s")
    parser.add_argument("--policies", default="fifo,backfill,easy")
    parser.add_argument("--packings", default="spread,pack")
    parser.add_argument("--interval", type=float, default=0.0, help="passes at most this often, s")
    parser.add_argument("--launch", type=float, default=0.0, help="placement -> process running, s")
    parser.add_argument("--release", type=float, default=0.0, help="process ended -> devices free, s")
    parser.add_argument("--margin", type=float, default=0.0, help="added to every time limit planned with, s")
    args = parser.parse_args()
    lag = Lag(args.interval, args.launch, args.release, args.margin)
    broken = 0
    print("seed  policy    packing  finished  util %  util while waiting %  queue non-empty s  wait mean s  "
          "reserved late / reserved  replay s")  # fmt: skip
    for seed in (int(s) for s in args.seeds.split(",")):
        for policy in args.policies.split(","):
            for packing in (Packing(p) for p in args.packings.split(",")):
                began = time.monotonic()
                window = args.minutes * 60
                r = replay(seed, policy, packing, hosts=args.hosts, jobs=args.jobs, window=window,
                           duration=tuple(args.duration), lag=lag)  # fmt: skip
                late, reserved = r["reserved late / reserved"]
                broken += late if not POLICIES[policy].holds_back else 0
                print(f"{seed:<5} {policy:<9} {packing.value:<8} {r['finished']:>8}  {r['util %']:>6.1f}  "
                      f"{r['util while waiting %']:>20.1f}  {r['queue non-empty s']:>17.1f}  "
                      f"{r['wait mean s']:>11.1f}  {f'{late} / {reserved}':>24}  {time.monotonic() - began:>8.1f}",
                      flush=True)  # fmt: skip
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
