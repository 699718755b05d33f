"""Gang placement of one distributed TensorFlow job onto a cluster's hosts: `place` says where it runs now, or why not
(now or never), and `take` marks a placed job's ports and devices used for the next job of a pass.

Plain Python (no Django): the caller turns rows into `HostState`s and writes the returned `Placement` back
as tasks. The job's shape is orchestrator/core/shapes.py, a host's state orchestrator/core/hosts.py, and the greedy
choice of each task's host and port orchestrator/core/assignment.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter

from contracts.environments import LABEL_PREFIX as ENV_LABEL
from orchestrator.core.assignment import Packing, TaskPlacement, assign_tasks
from orchestrator.core.hosts import HostState
from orchestrator.core.shapes import JobShape, device_tasks, fit_count, fits_free_counts, validate_shape


@dataclass(frozen=True)
class Placement:
    tasks: tuple[TaskPlacement, ...]


@dataclass(frozen=True)
class Unplaceable:
    reason: str
    permanent: bool


def place(
    shape: JobShape,
    hosts: Iterable[HostState],
    *,
    fits_empty: bool = False,
    packing: Packing | None = None,
    counted: bool = False,
    ordered: bool = False,
) -> Placement | Unplaceable:
    """Where the job runs now, or why not (`permanent`: never on these hosts). `fits_empty`: the caller knows this
    shape fits these hosts when idle (it placed the same shape in the same pass), so that check is skipped.
    `packing`: the cluster's (spread when not given). `counted`: the caller found the online hosts' free device counts
    hold the shape (`fits_free_counts`, as the planner asks before it places), so they are not counted again.
    `ordered`: `hosts` is a list in name order already (the planner keeps its states so), so it is not sorted again."""
    errors = validate_shape(shape)
    if errors:
        return Unplaceable("; ".join(message for _field, message in errors), permanent=True)
    # Sorting first makes the result independent of the order the caller listed hosts in.
    all_hosts = hosts if ordered and isinstance(hosts, list) else sorted(hosts, key=attrgetter("name"))
    matching = [h for h in all_hosts if shape.labels <= h.labels] if shape.labels else all_hosts
    if not matching:
        if shape.labels:
            plain = sorted(label for label in shape.labels if not label.startswith(ENV_LABEL))
            if not plain:
                return Unplaceable(f"no host{_labelled(shape)}", permanent=True)
            return Unplaceable(f"no host has labels {{{', '.join(plain)}}}{_labelled(shape, envs_only=True)}",
                               permanent=True)  # fmt: skip
        return Unplaceable("the cluster has no hosts", permanent=True)

    if not fits_empty:  # (a caller that knows the shape fits these hosts idle has no need of the permanent check)
        shortfall = _device_shortfall(
            shape.devices_per_worker, device_tasks(shape), [len(h.device_ids) for h in matching], now=False,
            where=_labelled(shape),
        )  # fmt: skip
        if shortfall:
            return Unplaceable(shortfall, permanent=True)
    online = [h for h in matching if h.online]
    free = None if counted else [len(h.free_devices) for h in online]
    failed = None
    if online and (free is None or fits_free_counts(shape, free)):
        result = assign_tasks(shape, online, all_hosts, packing or Packing.SPREAD)
        if not isinstance(result, str):
            # What fits the hosts as they are fits them idle (more free devices and ports, never fewer): the idle
            # check is only asked when the job does not fit now, to tell "not yet" from "never".
            return Placement(result)
        failed = result
    if free is None:
        free = [len(h.free_devices) for h in online]
    if not fits_empty:
        misfit = _idle_misfit(shape, matching)
        if misfit is not None:
            return Unplaceable(f"does not fit even an empty cluster: {misfit}", permanent=True)
    return _waits(shape, free, len(matching) - len(online), failed=failed)


def _waits(shape: JobShape, free_counts: Sequence[int], offline: int, *, failed: str | None = None) -> Unplaceable:
    """Why a job that fits the idle cluster does not fit now: its devices (the online hosts' free counts, of those
    its labels allow) or `failed`, what a placement tried on them ran into (a port); the hosts offline noted."""
    offline_note = f"{offline} host{'s' if offline != 1 else ''}{_labelled(shape)} offline"
    if not free_counts:
        return Unplaceable(offline_note, permanent=False)
    reason = failed or _device_shortfall(
        shape.devices_per_worker, device_tasks(shape), free_counts, now=True, where=_labelled(shape)
    )
    assert reason is not None, "_waits() is asked only of a job that does not fit"
    if offline:
        reason = f"{reason}; {offline_note}"
    return Unplaceable(reason, permanent=False)


def _labelled(shape: JobShape, *, envs_only: bool = False) -> str:
    """The words " labelled a, b", " with environment e", both, or "": which hosts the job may use. A task
    environment is a label `env:<name>` of the hosts that can run it (orchestrator/environments/availability.py)."""
    plain = sorted(label for label in shape.labels if not label.startswith(ENV_LABEL))
    envs = sorted(label[len(ENV_LABEL) :] for label in shape.labels if label.startswith(ENV_LABEL))
    said = f" labelled {', '.join(plain)}" if plain and not envs_only else ""
    return said + (f" with environment {', '.join(envs)}" if envs else "")


# Whether a shape fits the idle cluster, by shape and the hosts' fixed facts: a job that waits at the head of the
# queue is asked again on every pass, and its answer changes only when the hosts do. Bounded: emptied when full.
_IDLE_MISFITS: dict[tuple[JobShape, tuple[tuple[object, ...], ...]], str | None] = {}
_IDLE_MISFITS_MAX = 256


def _idle_misfit(shape: JobShape, hosts: Sequence[HostState]) -> str | None:
    """Why the job cannot fit these hosts even idle, or None."""
    key = (shape, tuple(h.fixed for h in hosts))
    if key not in _IDLE_MISFITS:
        if len(_IDLE_MISFITS) >= _IDLE_MISFITS_MAX:
            _IDLE_MISFITS.clear()
        ideal = [h.idle for h in hosts]
        result = assign_tasks(shape, ideal, ideal)
        _IDLE_MISFITS[key] = result if isinstance(result, str) else None
    return _IDLE_MISFITS[key]


def _device_shortfall(d: int, workers: int, capacities: Sequence[int], *, now: bool, where: str) -> str | None:
    """Why `workers` tasks of `d` devices each cannot fit hosts with these device counts, or None."""
    largest = max(capacities, default=0)
    total = sum(capacities)
    fits = sum(fit_count(d, c) for c in capacities)
    if largest < d:
        have = f"largest free is {largest}" if now else f"the largest host{where} has {largest}"
        return f"needs {d} devices on one host; {have}"
    if total < d * workers:
        have = f"{total} are free" if now else f"the cluster has {total}{' on hosts' + where if where else ''}"
        return f"needs {d * workers} devices in all across {workers} workers; {have}"
    if fits < workers:
        have = f"free devices fit {fits}" if now else f"the cluster fits {fits}{' on hosts' + where if where else ''}"
        return f"needs {workers} workers with {d} devices each; {have}"
    return None


def take(states: list[HostState], where: Placement, positions: dict[str, int] | None = None) -> list[HostState]:
    """Host states with a freshly placed job's ports and devices marked used, for the next job in this pass.
    `positions` (each host's index in `states`), when the caller keeps it, spares a look at every host: a planner
    starts dozens of jobs a pass on 500 hosts, each landing on a few."""
    by_host: dict[str, list[TaskPlacement]] = {}
    for task in where.tasks:
        by_host.setdefault(task.host, []).append(task)
    if positions is not None:
        taken = list(states)
        for name, tasks in by_host.items():
            i = positions[name]
            taken[i] = taken[i].with_used((t.port for t in tasks), (d for t in tasks for d in t.devices))
        return taken
    # Only the hosts the job landed on change: the others are kept as they are (a pass over 1,000 jobs on 500 hosts
    # would otherwise copy every host's state once per job).
    return [
        state.with_used((t.port for t in by_host[state.name]), (d for t in by_host[state.name] for d in t.devices))
        if state.name in by_host
        else state
        for state in states
    ]
