"""Choosing whom to preempt for a gang that does not fit: the fewest devices and the least work lost.

Plain Python. A candidate is a running job the waiting one may preempt (a lower preemptible class, or a borrower of
quota the waiting job's owner is entitled to: orchestrator/scheduler/queueing.py says which). Greedy, then pruned:
candidates are taken cheapest first (fewest devices, then most recent checkpoint: least work to redo) until the
gang fits on what they would free; then every chosen one that is not needed after all is given back.

No thrash (KAI-Scheduler's minimum runtime, and a bound on preemptions per job): a running job is not a candidate
while inside its class's minimum run time (counted from its latest placement), nor ever again once it has been
preempted `max_preemptions` times within `window_s`; `protected_until` says which, for the scheduler and the page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import inf

from orchestrator.core.assignment import Packing
from orchestrator.core.backfill_terms import Devices, free
from orchestrator.core.hosts import HostState
from orchestrator.core.placement import Placement, place
from orchestrator.core.shapes import JobShape, devices_needed

# A preemption stops at most this many jobs (the cheapest first): each try is a placement over the fleet.
MAX_VICTIMS = 64


@dataclass(frozen=True)
class Candidate:
    job_id: int
    devices: Devices
    since_checkpoint_s: float  # the work it loses if stopped now (since its last checkpoint, or since it started)

    @property
    def device_count(self) -> int:
        return sum(len(ids) for ids in self.devices.values())


@dataclass(frozen=True)
class Protection:
    """A priority class's protection of its running jobs from preemption (orchestrator/models/queueing.py)."""

    min_run_s: int
    max_preemptions: int | None  # None: no bound
    window_s: int


def protected_until(placed_at: float | None, protection: Protection, *, shielded: bool) -> float:
    """The earliest time (epoch seconds) a running job may be preempted: `inf` once it reached its bound (it is
    shielded until it ends), 0 when it has not been placed."""
    if shielded:
        return inf
    return placed_at + protection.min_run_s if placed_at is not None else 0.0


def reaches_bound(preempted_at: Sequence[float], now: float, protection: Protection) -> bool:
    """Whether the preemptions at these times (the latest one included) reach the class's bound within its window:
    after this one the job is shielded until it ends."""
    if protection.max_preemptions is None:
        return False
    recent = [at for at in preempted_at if at > now - protection.window_s]
    return len(recent) >= protection.max_preemptions


def _fits(shape: JobShape, states: Sequence[HostState], victims: Sequence[Candidate], packing: Packing) -> bool:
    freed: dict[str, set[int]] = {}
    for victim in victims:
        for host, ids in victim.devices.items():
            freed.setdefault(host, set()).update(ids)
    after = free(states, {h: frozenset(i) for h, i in freed.items()})
    if sum(len(state.free_devices) for state in after if state.online) < devices_needed(shape):
        return False  # too few devices whatever the placement: no need to try one
    return isinstance(place(shape, after, packing=packing), Placement)


def choose_victims(
    shape: JobShape, states: Sequence[HostState], candidates: Sequence[Candidate], packing: Packing = Packing.SPREAD
) -> list[int] | None:
    """The ids of the jobs to stop so that `shape` fits, or None when stopping all of them would not be enough."""
    ordered = sorted(candidates, key=lambda c: (c.device_count, c.since_checkpoint_s, -c.job_id))[:MAX_VICTIMS]
    chosen: list[Candidate] = []
    for candidate in ordered:
        chosen.append(candidate)
        if _fits(shape, states, chosen, packing):
            break
    else:
        return None
    for candidate in reversed(chosen[:-1]):  # the last one was needed: without it the gang did not fit
        trial = [c for c in chosen if c is not candidate]
        if _fits(shape, states, trial, packing):
            chosen = trial
    return [c.job_id for c in chosen]
