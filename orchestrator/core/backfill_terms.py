"""The terms of a backfill plan (orchestrator/core/backfill.py): a gang running now (`Running`), a job waiting
(`Waiting`), a reservation, a pass's outcome, and device sets by host (`Devices`) with the helpers that free, block and
merge them. Plain Python (no Django)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from orchestrator.core.hosts import HostState
from orchestrator.core.placement import Placement, Unplaceable
from orchestrator.core.shapes import JobShape

Devices = dict[str, frozenset[int]]  # host name -> device ids


@dataclass(frozen=True)
class Running:
    """A gang holding devices now, and when it will have let them go at the latest."""

    job_id: int
    ends_at: float
    devices: Devices


class Waiting(NamedTuple):
    """A job a pass offers (a tuple: a pass makes one per waiting job, thousands)."""

    job_id: int
    shape: JobShape
    limit_s: float


@dataclass(frozen=True)
class Reservation:
    job_id: int
    start: float
    end: float
    devices: Devices


@dataclass
class Outcome:
    started: list[tuple[Waiting, Placement]] = field(default_factory=list)
    reservations: dict[int, Reservation] = field(default_factory=dict)
    # Jobs that fit nowhere now and got no reservation (beyond the depth, or no release makes room): why not.
    unplaced: dict[int, Unplaceable | None] = field(default_factory=dict)
    # Jobs that cannot run on these hosts even idle (the cluster shrank since they were accepted).
    never: dict[int, Unplaceable] = field(default_factory=dict)
    # Jobs left waiting as they were: this pass neither started them nor planned their start (Planner.finish).
    deferred: list[int] = field(default_factory=list)


def devices_of(where: Placement) -> Devices:
    held: dict[str, set[int]] = {}
    for task in where.tasks:
        held.setdefault(task.host, set()).update(task.devices)
    return {host: frozenset(ids) for host, ids in held.items()}


def block(states: Sequence[HostState], blocked: Devices) -> Sequence[HostState]:
    """Host states with `blocked` devices marked used (reserved for someone else over this window)."""
    if not blocked:
        return states
    return [state.with_used((), blocked[state.name]) if state.name in blocked else state for state in states]


def free(states: Sequence[HostState], freed: Devices) -> list[HostState]:
    if not freed:
        return list(states)
    return [state.with_free(freed[state.name]) if state.name in freed else state for state in states]


def merge(into: dict[str, set[int]], more: Devices) -> None:
    for host, ids in more.items():
        into.setdefault(host, set()).update(ids)


def frozen(held: dict[str, set[int]]) -> Devices:
    return {host: frozenset(ids) for host, ids in held.items()}


def free_count(states: Sequence[HostState]) -> int:
    return sum(len(state.free_devices) for state in states if state.online)
