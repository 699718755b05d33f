"""Choosing whom to preempt for a gang that does not fit: the fewest devices and the least work lost.

Plain Python. A candidate is a running job the waiting one may preempt (a lower preemptible class, or a borrower of
quota the waiting job's owner is entitled to: orchestrator/scheduler/queueing.py says which). Greedy, then pruned:
candidates are taken cheapest first (fewest devices, then most recent checkpoint: least work to redo) until the
gang fits on what they would free; then every chosen one that is not needed after all is given back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
