"""Where each of one job's tasks goes, greedily (`assign_tasks`): a device-holding task takes a host by the cluster's
`Packing` (spread or pack), chief and ps fill in around them, each with a free port of its machine. Plain Python (no
Django); `orchestrator/core/placement.py`'s `place` asks it and says why a job does not fit."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from operator import attrgetter

from contracts.strategies import ROLE_ORDER
from orchestrator.core.hosts import HostState
from orchestrator.core.shapes import JobShape, required_tasks


@dataclass(frozen=True)
class TaskPlacement:
    type: str
    index: int
    host: str
    address: str
    port: int
    devices: tuple[int, ...]


class Packing(StrEnum):
    """Which host a device-holding task takes (a cluster's choice; Kubernetes' LeastAllocated / MostAllocated)."""

    # The most free devices: a gang's workers land on many hosts (a lost host takes fewer of them), but a busy fleet
    # is left with a few free devices on every host and no whole host for an 8-device worker.
    SPREAD = "spread"
    # Best fit (Slurm's default): the fewest free devices that still hold the task. Small tasks fill hosts already in
    # use, whole hosts stay free for wide workers, and a gang's workers share hosts (local collectives).
    PACK = "pack"


@dataclass
class _Slot:
    """Working state of one candidate host while a job is being placed."""

    host: HostState
    free: list[int]
    job_tasks: int = 0


def assign_tasks(
    shape: JobShape, candidates: Sequence[HostState], all_hosts: Sequence[HostState], packing: Packing = Packing.SPREAD
) -> tuple[TaskPlacement, ...] | str:
    """Greedy placement onto `candidates` by `packing`; a reason string when some task does not fit.

    A device-holding task takes, among the hosts with enough free devices and a free port, the one whose free count
    comes first by `packing` (most or fewest), then the one with the fewest of this job's tasks, then the name: a total
    order, so placement is deterministic. Chief and ps (no devices) take the host with the fewest of the job's tasks.
    Hosts wait in heaps bucketed by free devices, so a task costs O(devices per host + log hosts) rather than a sort
    of every host: a 64-worker job on 500 hosts was 64 sorts of 500."""
    by_machine = _machine_index(tuple(map(_MACHINE, all_hosts)))
    taken: dict[str, set[int]] = {}  # per machine, built when first asked: most machines are never looked at

    def port_for(slot: _Slot) -> int | None:
        machine = slot.host.machine
        if machine not in taken:
            on = (all_hosts[i] for i in by_machine.get(machine, ()))
            taken[machine] = {p for h in on for p in h.used_ports | h.excluded_ports}
        used = taken[machine]
        return next((p for p in range(slot.host.port_min, slot.host.port_max + 1) if p not in used), None)

    slots: dict[int, _Slot] = {}  # made when a task first looks at the host: most hosts are never looked at

    def slot_at(i: int) -> _Slot:
        if i not in slots:
            slots[i] = _Slot(candidates[i], list(candidates[i].free_devices))
        return slots[i]

    def free_of(i: int) -> int:
        return len(slots[i].free) if i in slots else len(candidates[i].free_devices)

    def tasks_of(i: int) -> int:
        return slots[i].job_tasks if i in slots else 0

    # Device-holding tasks: free count -> heap of (the job's tasks there, name, index). An entry is current when its
    # host still has that free count and task count; a host that takes a task is pushed again under its new ones.
    buckets: dict[int, list[tuple[int, str, int]]] = {}
    # Chief and ps: one heap of (the job's tasks there, name, index), re-ranked lazily when popped.
    plain: list[tuple[int, str, int]] | None = None

    specs = required_tasks(shape)
    fewest = min((spec.devices for spec in specs if spec.devices), default=0)

    def pop_fitting(devices: int) -> tuple[int | None, list[int]]:
        """The host a task of `devices` devices takes and its port's owner, or None and the fitting hosts that had no
        free port."""
        if not buckets:
            # Only hosts that hold a device task of this job at all: on a busy fleet, a few of hundreds (a host that
            # takes a task is pushed again under its new count below). Built by the job's first task, before any
            # host has a slot: each host's free count is its state's.
            for i, host in enumerate(candidates):
                free = len(host.free_devices)
                if free >= fewest:
                    buckets.setdefault(free, []).append((0, host.name, i))
            for heap in buckets.values():
                heapq.heapify(heap)
        counts = sorted((c for c in buckets if c >= devices), reverse=packing is Packing.SPREAD)
        portless: list[int] = []
        for count in counts:
            heap = buckets[count]
            while heap:
                job_tasks, _name, i = heapq.heappop(heap)
                if free_of(i) != count or tasks_of(i) != job_tasks:
                    continue  # outdated: the host is in the heaps under its current counts
                if port_for(slot_at(i)) is None:
                    portless.append(i)
                    continue
                for j in portless:
                    heapq.heappush(buckets[free_of(j)], (tasks_of(j), candidates[j].name, j))
                return i, []
        for j in portless:
            heapq.heappush(buckets[free_of(j)], (tasks_of(j), candidates[j].name, j))
        return None, portless

    def pop_plain() -> tuple[int | None, list[int]]:
        nonlocal plain
        if plain is None:
            plain = [(tasks_of(i), candidates[i].name, i) for i in range(len(candidates))]
            heapq.heapify(plain)
        portless: list[int] = []
        chosen = None
        while plain:
            job_tasks, _name, i = heapq.heappop(plain)
            if job_tasks != tasks_of(i):
                continue  # outdated: the host was pushed again when it took a task
            if port_for(slot_at(i)) is None:
                portless.append(i)
                continue
            chosen = i
            break
        for j in portless:
            heapq.heappush(plain, (tasks_of(j), candidates[j].name, j))
        return chosen, ([] if chosen is not None else portless)

    # Device-holding tasks first, so the devices decide the spread; chief and ps then fill in around them.
    ordered = [s for s in specs if s.devices] + [s for s in specs if not s.devices]
    placed: list[TaskPlacement] = []
    for spec in ordered:
        chosen, portless = pop_fitting(spec.devices) if spec.devices else pop_plain()
        if chosen is None:
            if portless:
                return f"no free port on {', '.join(sorted(candidates[i].name for i in portless))}"
            largest = max((free_of(i) for i in range(len(candidates))), default=0)
            return f"needs {spec.devices} devices on one host; largest free is {largest}"
        slot = slots[chosen]
        port = port_for(slot)
        assert port is not None
        devices = tuple(slot.free[: spec.devices])
        del slot.free[: spec.devices]
        slot.job_tasks += 1
        if buckets:
            heapq.heappush(buckets.setdefault(len(slot.free), []), (slot.job_tasks, slot.host.name, chosen))
        if plain is not None:
            heapq.heappush(plain, (slot.job_tasks, slot.host.name, chosen))
        taken[slot.host.machine].add(port)
        placed.append(TaskPlacement(spec.type, spec.index, slot.host.name, slot.host.address, port, devices))
    return tuple(sorted(placed, key=lambda t: (ROLE_ORDER.index(t.type), t.index)))


_MACHINE = attrgetter("machine")


@lru_cache(maxsize=64)
def _machine_index(machines: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """Which hosts (by position) share each machine: the hosts' ports on one machine are one pool. A pass places onto
    the same fleet dozens of times, so it is made once per fleet (callers must not change it)."""
    index: dict[str, list[int]] = {}
    for i, machine in enumerate(machines):
        index.setdefault(machine, []).append(i)
    return {machine: tuple(positions) for machine, positions in index.items()}
