"""Fair share over a simulated week: does each account get its share of the fleet's device-hours?

    .venv/bin/python bench/fair_share_replay.py [--seeds 31,32,33] [--hosts 4] [--days 7] [--half-lives 0,7,inf]

A team of four with equal shares (no quotas: the queue orders one class by fair share alone) on `--hosts` hosts of 8
devices, each account's demand above its share, at different times:

- steady: from day 0, 1-2-device jobs of 1-4 h, always a backlog;
- wide:   from day 0, 8-device jobs of 4-10 h, always a backlog;
- daytime: each day at 09:00 a batch of 2-device jobs of 2-4 h (about a day's share), the nights idle;
- late:   from day 2 on (a new project), 4-device jobs of 2-6 h, always a backlog.

Jobs are queued as they are submitted and replayed through the product's planner (orchestrator/core: backfill.Planner,
placement, backfill reserving for 8 jobs) in simulated time; time limits are 1.5x the true run times. The queue's
order within the class is the product's (orchestrator/scheduler/queueing.py): the higher fair-share factor first
(orchestrator/core/fair_share.py: Slurm's 2^(-U/S) from decayed usage, running tasks counted live), then fewer
devices in use now, then submission. Half-lives, in days: `0` is no memory (only the devices used now order
accounts: the policy before issue 46, and what a half-life of 0 would do), `inf` never forgets.

Prints, per seed and half-life, each account's device-hours over the window against its entitled share (a quarter
of the fleet's device-hours: every account wants more than that over the week, though `late` and `daytime` not at
every hour of it), the largest relative miss and how busy the fleet was. No preemption happens there (one class).

Then (unless `--low ''`) the same week with `--low`'s jobs in the preemptible class `low`: the first reserved normal
job more than a minute from its start preempts the cheapest unprotected low jobs (orchestrator/core/preemption.py
chooses, as the scheduler does). Per seed, saving at each 20-minute epoch end or at the stop's step, with the
classes' protections (5-minute minimum run, at most 3 preemptions a day) and without: how many low jobs were
preempted, preemptions per preempted job (mean and max), the device-hours of work thrown away (since the last save,
plus the 3 s grace) and the low account's device-hours.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from queue_replay import DEVICES_PER_HOST, fleet, release  # noqa: E402 - bench/queue_replay.py

from contracts.strategies import Strategy  # noqa: E402
from orchestrator.core import backfill, backfill_terms, fair_share, placement, preemption  # noqa: E402
from orchestrator.core.assignment import Packing  # noqa: E402
from orchestrator.core.placement import Placement  # noqa: E402
from orchestrator.core.shapes import JobShape  # noqa: E402

HOUR, DAY = 3600.0, 86_400.0
ACCOUNTS = ("steady", "wide", "daytime", "late")


@dataclass(frozen=True)
class SimJob:
    job_id: int
    account: str
    submitted: float
    devices: int
    runs: float  # true run time left, s
    low: bool = False  # of the preemptible class `low` (the others: `normal`)


@dataclass
class Preempting:
    """Preemption in the replay (--low): the low account's jobs are preemptible; the first reserved normal job whose
    reservation is more than MARGIN_S away stops the cheapest unprotected set (orchestrator/core/preemption.py). A
    victim loses its work since its last save (`save`: "epoch", every EPOCH_S of its run; "step": at the stop, the
    grace alone) and the grace, and waits again with its place kept."""

    protection: preemption.Protection
    save: str
    counts: dict[int, int]
    times: dict[int, list[float]]
    shielded: set[int]
    lost_s: float = 0.0  # device-seconds of work thrown away


MARGIN_S = 60.0
GRACE_S = 3.0
EPOCH_S = 20 * 60.0
PROTECTED = preemption.Protection(min_run_s=300, max_preemptions=3, window_s=86_400)  # the classes' defaults
UNPROTECTED = preemption.Protection(min_run_s=0, max_preemptions=None, window_s=0)


def mix(seed: int, days: float, capacity: int) -> list[SimJob]:
    """The four accounts' submissions (this module's docstring), each a backlog above its quarter of `capacity`."""
    rng = random.Random(seed)
    quarter = capacity / 4
    jobs: list[SimJob] = []

    def backlog(account: str, start: float, devices: tuple[int, ...], hours: tuple[float, float]) -> None:
        # Enough work to keep twice its share busy from `start` to the end, submitted in daily batches.
        day = start
        while day < days * DAY:
            want, made = 2 * quarter * DAY, 0.0
            while made < want:
                n, runs = rng.choice(devices), rng.uniform(*hours) * HOUR
                jobs.append(SimJob(0, account, day + rng.uniform(0, HOUR), n, runs))
                made += n * runs
            day += DAY

    backlog("steady", 0.0, (1, 2), (1, 4))
    backlog("wide", 0.0, (8,), (4, 10))
    backlog("late", 2 * DAY, (4,), (2, 6))
    for d in range(math.ceil(days)):  # daytime: a day's share at 09:00, nothing more
        made = 0.0
        while made < quarter * DAY:
            runs = rng.uniform(2, 4) * HOUR
            jobs.append(SimJob(0, "daytime", d * DAY + 9 * HOUR + rng.uniform(0, 600), 2, runs))
            made += 2 * runs
    jobs.sort(key=lambda j: (j.submitted, j.account))
    return [SimJob(n, j.account, j.submitted, j.devices, j.runs) for n, j in enumerate(jobs, start=1)]


def shape(devices: int) -> JobShape:
    return JobShape(Strategy.MIRRORED, 1, 0, devices)


def replay(
    seed: int, hosts: int, days: float, half_life_days: float, preempting: Preempting | None = None, low: str = ""
) -> dict[str, float]:
    """Each account's device-hours within the window."""
    capacity = hosts * DEVICES_PER_HOST
    window = days * DAY
    submissions = [SimJob(j.job_id, j.account, j.submitted, j.devices, j.runs, j.account == low)
                   for j in mix(seed, days, capacity)]  # fmt: skip
    memory = half_life_days > 0
    half_life = half_life_days * DAY if memory and math.isfinite(half_life_days) else 1e18
    states = fleet(hosts)
    ledger: dict[str, tuple[float, float]] = {a: (0.0, 0.0) for a in ACCOUNTS}  # ended tasks' decayed use, as of
    running: dict[int, tuple[float, Placement, SimJob, float]] = {}  # job id -> (limit's end, where, job, start)
    ends: list[tuple[float, int]] = []
    used: dict[str, float] = defaultdict(float)  # device-seconds within the window
    waiting: list[SimJob] = []
    reservations: dict[int, backfill_terms.Reservation] = {}
    next_submission, now = 0, 0.0
    while now < window:
        while next_submission < len(submissions) and submissions[next_submission].submitted <= now:
            waiting.append(submissions[next_submission])
            next_submission += 1
        order(waiting, ledger, running, now, half_life, memory)
        planner = backfill.Planner(
            states,
            [backfill_terms.Running(pk, end, backfill_terms.devices_of(w)) for pk, (end, w, _j, _s) in running.items()],
            now=now, depth=8, take=placement.take, previous=reservations, packing=Packing.SPREAD,
        )  # fmt: skip
        still: list[SimJob] = []
        for job in waiting:
            where = planner.offer(backfill_terms.Waiting(job.job_id, shape(job.devices), 1.5 * job.runs))
            if isinstance(where, Placement):
                running[job.job_id] = (now + 1.5 * job.runs, where, job, now)
                heapq.heappush(ends, (now + job.runs, job.job_id))
            else:
                still.append(job)
        planner.finish(plan_all=True)
        reservations, states, waiting = planner.outcome.reservations, planner.states, still
        if preempting is not None:
            stopped = preempt(preempting, waiting, reservations, running, states, now, window, used)
            if stopped:
                for job_id, where, victim, start in stopped:
                    states = release(states, where)
                    value, as_of = ledger[victim.account]
                    ledger[victim.account] = fair_share.added(
                        value, as_of, fair_share.accrued(victim.devices, start, now, half_life), now, half_life
                    )
                    ends[:] = [(at, pk) for at, pk in ends if pk != job_id]
                    heapq.heapify(ends)
                    waiting.append(victim)
                continue  # a pass again at once: the preemptor starts on what its victims freed
        upcoming = [ends[0][0]] if ends else []
        if next_submission < len(submissions):
            upcoming.append(submissions[next_submission].submitted)
        if not upcoming:
            break
        now = min(upcoming)
        while ends and ends[0][0] <= now:
            at, job_id = heapq.heappop(ends)
            _end, where, job, start = running.pop(job_id)
            states = release(states, where)
            used[job.account] += job.devices * (min(at, window) - start)
            value, as_of = ledger[job.account]
            ledger[job.account] = fair_share.added(
                value, as_of, fair_share.accrued(job.devices, start, at, half_life), at, half_life
            )
    for _end, _where, job, start in running.values():  # still running at the window's end: their part counts
        used[job.account] += job.devices * max(0.0, window - start)
    return {account: used[account] / HOUR for account in ACCOUNTS}


def preempt(
    p: Preempting,
    waiting: list[SimJob],
    reservations: dict[int, backfill_terms.Reservation],
    running: dict[int, tuple[float, Placement, SimJob, float]],
    states: list,  # type: ignore[type-arg]
    now: float,
    window: float,
    used: dict[str, float],
) -> list[tuple[int, Placement, SimJob, float]]:
    """The first reserved normal job far from its start stops the cheapest unprotected low jobs it needs."""
    for job in waiting:
        reserved = reservations.get(job.job_id)
        if job.low or reserved is None or reserved.start <= now + MARGIN_S:
            continue
        candidates = []
        for pk, (_end, where, victim, start) in running.items():
            until = preemption.protected_until(start, p.protection, shielded=pk in p.shielded)
            if victim.low and until <= now:
                candidates.append(preemption.Candidate(pk, backfill_terms.devices_of(where), _unsaved(p, start, now)))
        chosen = preemption.choose_victims(shape(job.devices), states, candidates, Packing.SPREAD)
        if not chosen:
            return []
        stopped = []
        for pk in chosen:
            _end, where, victim, start = running.pop(pk)
            lost = _unsaved(p, start, now) + GRACE_S
            p.lost_s += victim.devices * lost
            used[victim.account] += victim.devices * (min(now, window) - start)
            p.counts[pk] = p.counts.get(pk, 0) + 1
            p.times.setdefault(pk, []).append(now)
            if preemption.reaches_bound(p.times[pk], now, p.protection):
                p.shielded.add(pk)
            left = victim.runs - (now - start - lost + GRACE_S)
            requeued = SimJob(pk, victim.account, victim.submitted, victim.devices, left, True)
            stopped.append((pk, where, requeued, start))
        return stopped
    return []


def _unsaved(p: Preempting, start: float, now: float) -> float:
    """The seconds of its run a job stopped now throws away: since its last epoch end, or nothing (a step's save)."""
    return (now - start) % EPOCH_S if p.save == "epoch" else 0.0


def order(
    waiting: list[SimJob],
    ledger: dict[str, tuple[float, float]],
    running: dict[int, tuple[float, Placement, SimJob, float]],
    now: float,
    half_life: float,
    memory: bool,
) -> None:
    """The product's order within one class and no quotas: fair-share factor (from decayed usage, ended and running
    tasks), then devices in use now, then submission."""
    devices_now: dict[str, int] = defaultdict(int)
    decayed = {a: fair_share.decay(value, now - as_of, half_life) for a, (value, as_of) in ledger.items()}
    for _end, _where, job, start in running.values():
        devices_now[job.account] += job.devices
        decayed[job.account] += fair_share.accrued(job.devices, start, now, half_life)
    factor = fair_share.factors(decayed, fair_share.equal_shares(ACCOUNTS)) if memory else dict.fromkeys(ACCOUNTS, 1.0)
    waiting.sort(key=lambda j: (j.low, -factor[j.account], devices_now[j.account], j.submitted, j.job_id))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="31,32,33")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--half-lives", default="0,7,inf", help="days; 0: no memory, inf: never forgets")
    parser.add_argument("--low", default="steady", help="whose jobs are preemptible in the second table ('': none)")
    args = parser.parse_args()
    capacity = args.hosts * DEVICES_PER_HOST
    entitled = capacity * args.days * 24 / len(ACCOUNTS)
    print(f"{capacity} devices, {args.days:g} days: each account's entitled share {entitled:.0f} device-h (a quarter)")
    print("seed  half-life  " + "  ".join(f"{a:>14}" for a in ACCOUNTS) + "  worst miss  busy %")
    for seed in (int(s) for s in args.seeds.split(",")):
        for half_life in (float(h) for h in args.half_lives.split(",")):
            hours = replay(seed, args.hosts, args.days, half_life)
            misses = {a: hours[a] / entitled - 1 for a in ACCOUNTS}
            worst = max(misses.values(), key=abs)
            cells = "  ".join(f"{hours[a]:>7.0f} ({misses[a]:+4.0%})" for a in ACCOUNTS)
            busy = sum(hours.values()) / (capacity * args.days * 24) * 100
            print(f"{seed:<5} {half_life:>8g}d  {cells}  {worst:>+10.0%}  {busy:>6.1f}", flush=True)
    if args.low:
        preemptions(args, capacity)
    return 0


def preemptions(args: argparse.Namespace, capacity: int) -> None:
    """The same week with one account's jobs in the preemptible class: preemptions per job and the work they threw
    away, with the classes' protections (a 5-minute minimum run, 3 preemptions a day) and without, saving at each
    epoch end or at the stop's step."""
    print(f"\n{args.low}'s jobs low (preemptible), the others normal; half-life 7 d")
    print("seed  save   protected  low jobs  preempted  per job mean/max  device-h lost  low's device-h  busy %")
    for seed in (int(s) for s in args.seeds.split(",")):
        for save in ("epoch", "step"):
            for protected in (True, False):
                p = Preempting(PROTECTED if protected else UNPROTECTED, save, {}, {}, set())
                hours = replay(seed, args.hosts, args.days, 7.0, p, low=args.low)
                low_jobs = sum(1 for j in mix(seed, args.days, capacity) if j.account == args.low)
                counts = list(p.counts.values())
                busy = sum(hours.values()) / (capacity * args.days * 24) * 100
                print(f"{seed:<5} {save:<6} {'yes' if protected else 'no':<9}  {low_jobs:>8}  {len(counts):>9}  "
                      f"{sum(counts) / max(len(counts), 1):>9.2f}/{max(counts, default=0):<6} "
                      f"{p.lost_s / HOUR:>13.1f}  {hours[args.low]:>14.0f}  {busy:>6.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
