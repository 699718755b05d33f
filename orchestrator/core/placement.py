"""Gang placement of one distributed TensorFlow job onto a cluster's hosts.

Plain Python (no Django): the caller turns rows into `HostState`s and writes the returned `Placement` back
as tasks.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property, lru_cache
from operator import attrgetter

from contracts.environments import LABEL_PREFIX as ENV_LABEL
from contracts.limits import MAX_DEVICES_PER_WORKER, MAX_PS, MAX_WORKERS
from contracts.strategies import ROLE_ORDER, Strategy, TaskType


@dataclass(frozen=True)
class JobShape:
    strategy: Strategy
    workers: int
    ps: int
    devices_per_worker: int
    labels: frozenset[str] = frozenset()

    def __hash__(self) -> int:
        # Hashed once: a pass looks every waiting job's shape up in several caches (thousands of jobs, a few dozen
        # shapes), and the generated __hash__ builds and hashes the tuple of fields on every call.
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = self.__dict__["_hash"] = hash((self.strategy, self.workers, self.ps, self.devices_per_worker,
                                                    self.labels))  # fmt: skip
        return cached


@dataclass(frozen=True)
class TaskSpec:
    """One process a job needs, before it has a host."""

    type: str
    index: int
    devices: int


@dataclass(frozen=True)
class HostState:
    name: str
    address: str
    port_min: int
    port_max: int
    device_ids: tuple[int, ...]
    gpu: bool
    labels: frozenset[str]
    online: bool
    used_devices: frozenset[int]
    used_ports: frozenset[int]
    excluded_ports: frozenset[int] = frozenset()

    @cached_property
    def free_devices(self) -> tuple[int, ...]:
        # Asked for by every job a pass looks at, of every host: computed once per state (a state is never changed,
        # `take` makes a new one for a host a job landed on).
        return tuple(sorted(set(self.device_ids) - self.used_devices))

    def with_used(self, ports: Iterable[int], devices: Iterable[int]) -> HostState:
        """This host with more ports and devices in use (a job just placed on it, or devices reserved for another)."""
        return self._with(self.used_ports | frozenset(ports), self.used_devices | frozenset(devices))

    def with_free(self, devices: Iterable[int]) -> HostState:
        """This host with these devices free again (a running gang that will have ended by some time)."""
        return self._with(self.used_ports, self.used_devices - frozenset(devices))

    def _with(self, used_ports: frozenset[int], used_devices: frozenset[int]) -> HostState:
        # Made by the constructor, not dataclasses.replace (which looks the fields up on every call: a pass makes tens
        # of thousands of these). What does not depend on use (the idle copy, the machine, the fixed facts) is carried
        # over, so the next job of the pass does not compute it again.
        made = HostState(
            name=self.name, address=self.address, port_min=self.port_min, port_max=self.port_max,
            device_ids=self.device_ids, gpu=self.gpu, labels=self.labels, online=self.online,
            used_devices=used_devices, used_ports=used_ports, excluded_ports=self.excluded_ports,
        )  # fmt: skip
        for name in _CARRIED:
            if name in self.__dict__:
                made.__dict__[name] = self.__dict__[name]
        return made

    @cached_property
    def fixed(self) -> tuple[object, ...]:
        """What does not depend on use or liveness: all that the idle check reads."""
        return (self.name, self.address, self.port_min, self.port_max, self.device_ids, self.gpu, self.labels)

    @cached_property
    def machine(self) -> str:
        return machine_of(self.address)

    @cached_property
    def idle(self) -> HostState:
        """This host online with nothing running: what "does the job fit the cluster at all" is judged on."""
        return dataclasses.replace(
            self, online=True, used_devices=frozenset(), used_ports=frozenset(), excluded_ports=frozenset()
        )


_CARRIED = ("idle", "machine", "fixed")  # HostState's cached facts that do not depend on use


@dataclass(frozen=True)
class TaskPlacement:
    type: str
    index: int
    host: str
    address: str
    port: int
    devices: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    tasks: tuple[TaskPlacement, ...]


@dataclass(frozen=True)
class Unplaceable:
    reason: str
    permanent: bool


def validate_shape(shape: JobShape) -> list[tuple[str, str]]:
    """What is wrong with the shape, as (field, message) pairs: the field is the job's (`workers`, `ps`, ...)."""
    errors: list[tuple[str, str]] = []
    try:
        strategy = Strategy(shape.strategy)
    except ValueError:
        choices = ", ".join(s.value for s in Strategy)
        return [("strategy", f"unknown strategy {shape.strategy!r}; choose one of {choices}")]
    if strategy is Strategy.MIRRORED:
        if shape.workers != 1:
            errors.append(("workers", f"mirrored runs exactly 1 worker, not {shape.workers}"))
        if shape.ps != 0:
            errors.append(("ps", "mirrored takes no parameter servers"))
    elif strategy is Strategy.MULTI_WORKER_MIRRORED:
        if shape.workers < 1:
            errors.append(("workers", "multi_worker_mirrored needs at least 1 worker"))
        if shape.ps != 0:
            errors.append(("ps", "multi_worker_mirrored takes no parameter servers"))
    else:
        if shape.workers < 1:
            errors.append(("workers", "parameter_server needs at least 1 worker"))
        if shape.ps < 1:
            errors.append(("ps", "parameter_server needs at least 1 ps"))
    if shape.workers > MAX_WORKERS:
        errors.append(("workers", f"at most {MAX_WORKERS} workers, not {shape.workers}"))
    if shape.ps > MAX_PS:
        errors.append(("ps", f"at most {MAX_PS} ps, not {shape.ps}"))
    if shape.devices_per_worker < 1:
        errors.append(("devices_per_worker", "devices_per_worker must be at least 1"))
    elif shape.devices_per_worker > MAX_DEVICES_PER_WORKER:
        errors.append(
            (
                "devices_per_worker",
                f"at most {MAX_DEVICES_PER_WORKER} devices per worker, not {shape.devices_per_worker}",
            )
        )
    return errors


@lru_cache(maxsize=1024)
def required_tasks(shape: JobShape) -> tuple[TaskSpec, ...]:
    """The processes a (valid) shape needs, in TF_CONFIG role order (asked by every placement: made once per shape;
    TaskSpecs are frozen)."""
    d = shape.devices_per_worker
    strategy = Strategy(shape.strategy)
    if strategy is Strategy.MIRRORED:
        return (TaskSpec(TaskType.WORKER, 0, d),)
    workers = tuple(TaskSpec(TaskType.WORKER, i, d) for i in range(shape.workers))
    if strategy is Strategy.MULTI_WORKER_MIRRORED:
        return workers
    chief = (TaskSpec(TaskType.CHIEF, 0, 0),)
    return chief + workers + tuple(TaskSpec(TaskType.PS, i, 0) for i in range(shape.ps))


@lru_cache(maxsize=1024)
def devices_needed(shape: JobShape) -> int:
    """The devices a (valid) shape holds in all (asked of every waiting job, every pass: a queue has a few shapes)."""
    return sum(task.devices for task in required_tasks(shape))


@lru_cache(maxsize=1024)
def device_tasks(shape: JobShape) -> int:
    """How many of a (valid) shape's tasks hold devices: its workers (`devices_per_worker` each, on one host)."""
    return 1 if Strategy(shape.strategy) is Strategy.MIRRORED else shape.workers


def fit_count(devices_per_task: int, free: int) -> int:
    """How many tasks of `devices_per_task` devices a host with `free` free devices holds."""
    return free // devices_per_task


def fits_free_counts(shape: JobShape, free_counts: Iterable[int]) -> bool:
    """Whether the shape's device-holding tasks fit hosts with these free device counts, ports aside. Every such task
    takes `devices_per_worker` devices of one host, so wherever it lands it lowers the sum of `fit_count` by exactly
    one: they fit exactly when that sum reaches their number, and then any greedy order (spread or pack) places them
    all. The planner asks this before a full placement (most of its tries on a busy fleet do not fit)."""
    return sum(fit_count(shape.devices_per_worker, c) for c in free_counts) >= device_tasks(shape)


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
        result = _assign(shape, online, all_hosts, packing or Packing.SPREAD)
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
        result = _assign(shape, ideal, ideal)
        _IDLE_MISFITS[key] = result if isinstance(result, str) else None
    return _IDLE_MISFITS[key]


def capacity_summary(hosts: Iterable[HostState]) -> dict[str, int]:
    hosts = list(hosts)
    online = [h for h in hosts if h.online]
    free = [len(h.free_devices) for h in online]
    return {
        "hosts": len(hosts),
        "online": len(online),
        "devices": sum(len(h.device_ids) for h in hosts),
        "free_devices": sum(free),
        "largest_free": max(free, default=0),
    }


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


def machine_of(address: str) -> str:
    """The machine a host's address stands for: every loopback address is this one machine."""
    # TF's gRPC server binds 0.0.0.0, so every loopback address is the same machine for port purposes.
    if address.startswith("127.") or address in ("localhost", "::1"):
        return "loopback"
    return address


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


def _assign(
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
