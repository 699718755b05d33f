"""Backfill over reservations (Slurm's backfill, conservative to a depth): which waiting gangs start now, and when the
others will at the latest. Plain Python, no Django: scheduling.py turns rows into these and writes the outcome back.

Time comes from time limits: a running gang's devices are free at the latest when its placement's limit (plus the stop
grace) runs out, since the watchdog stops it there. Walking the queue in its order, a job
- starts now when it fits on the devices that are free now and touches no device that an earlier job holds a
  reservation on for a window overlapping its own run (now .. now + its limit);
- otherwise (up to `depth` such jobs) gets a reservation: the earliest release time at which its gang fits on what
  running gangs will have freed by then, minus what earlier reservations hold over its window.
So a job behind a reservation starts now only if it ends (by its limit) before the reservation begins or uses none of
the reserved devices, and no reservation is ever pushed later by a job behind it: the head starts no later than its
reservation, as long as running jobs keep to their limits (they are made to).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from orchestrator.core.placement import HostState, JobShape, Packing, Placement, Unplaceable, place, required_tasks

Devices = dict[str, frozenset[int]]  # host name -> device ids


@dataclass(frozen=True)
class Running:
    """A gang holding devices now, and when it will have let them go at the latest."""

    job_id: int
    ends_at: float
    devices: Devices


@dataclass(frozen=True)
class Waiting:
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


def _block(states: Sequence[HostState], blocked: Devices) -> list[HostState]:
    """Host states with `blocked` devices marked used (reserved for someone else over this window)."""
    if not blocked:
        return list(states)
    return [state.with_used((), blocked[state.name]) if state.name in blocked else state for state in states]


def free(states: Sequence[HostState], freed: Devices) -> list[HostState]:
    if not freed:
        return list(states)
    return [state.with_free(freed[state.name]) if state.name in freed else state for state in states]


def _merge(into: dict[str, set[int]], more: Devices) -> None:
    for host, ids in more.items():
        into.setdefault(host, set()).update(ids)


def _frozen(held: dict[str, set[int]]) -> Devices:
    return {host: frozenset(ids) for host, ids in held.items()}


def _needed(shape: JobShape) -> int:
    return sum(task.devices for task in required_tasks(shape))


def _free_count(states: Sequence[HostState]) -> int:
    return sum(len(state.free_devices) for state in states if state.online)


class Planner:
    """One pass's plan. `take` marks a started job's ports and devices used in the states (placement.take)."""

    def __init__(
        self,
        states: Sequence[HostState],
        running: Sequence[Running] | Callable[[], Sequence[Running]],
        *,
        now: float,
        depth: int,
        take: Callable[[list[HostState], Placement], list[HostState]],
        previous: dict[int, Reservation] | None = None,
        packing: Packing = Packing.SPREAD,
    ) -> None:
        self.states = list(states)
        self.packing = packing  # the cluster's: how a job starting now, or a reservation, picks its hosts
        # The last pass's reservations: one that still holds (its devices are free by its start, and no reservation
        # ahead now overlaps it) is kept instead of planned again (Planner.finish(plan_all=True) plans all afresh).
        self._previous = previous or {}
        self._release_at: dict[tuple[str, int], float] | None = None
        # Read only when some job does not fit now (a reservation needs it): most passes on a fleet with room never do.
        self._running_source = running
        self._running: list[Running] | None = None
        self._started: list[Running] = []  # gangs this pass started
        self.now = now
        self.depth = depth
        self._take = take
        self.take = take
        self.outcome = Outcome()
        self._free_now: int | None = None
        self._fleet: int | None = None  # the hosts' fixed facts, hashed: the key of the idle verdicts
        self._pending: list[tuple[Waiting, Unplaceable | None]] = []  # waiting, in order, no reservation yet
        self._misfits: dict[tuple[JobShape, tuple[tuple[str, frozenset[int]], ...]], Unplaceable] = {}

    @property
    def running(self) -> list[Running]:
        if self._running is None:
            source = self._running_source() if callable(self._running_source) else self._running_source
            self._running = sorted([*source, *self._started], key=lambda r: r.ends_at)
        return self._running

    def _count_free_now(self) -> int:
        """Free devices on online hosts now, reservations aside: a bound that rules most misfits out cheaply."""
        if self._free_now is None:
            self._free_now = _free_count(self.states)
        return self._free_now

    def _never(self, shape: JobShape) -> Unplaceable | None:
        """Why the shape fits not even the idle cluster (None: it does). Asked of every job that does not fit now, so
        kept across passes for as long as the hosts' fixed facts (names, addresses, ports, devices, labels) are the
        same."""
        if self._fleet is None:
            self._fleet = hash(tuple(state.fixed for state in self.states))
        key = (self._fleet, shape)
        if key not in _IDLE_VERDICTS:
            if len(_IDLE_VERDICTS) > 4096:
                _IDLE_VERDICTS.clear()
            result = place(shape, [state.idle for state in self.states])
            _IDLE_VERDICTS[key] = result if isinstance(result, Unplaceable) and result.permanent else None
        return _IDLE_VERDICTS[key]

    def _held_over(self, start: float, end: float) -> Devices:
        """What reservations hold during [start, end)."""
        held: dict[str, set[int]] = {}
        for reservation in self.outcome.reservations.values():
            if reservation.start < end and start < reservation.end:
                _merge(held, reservation.devices)
        return _frozen(held)

    def offer(self, job: Waiting) -> Placement | None:
        """Start `job` now if it may (the placement), else leave it waiting (None). Its reservation is made only
        when it is needed: when a job behind it fits now (it must keep clear of it), or at `finish` when the pass
        plans every waiting job's start. A pass over a full fleet where nothing fits then costs little."""
        end = self.now + job.limit_s
        needed = _needed(job.shape)
        result: Placement | Unplaceable | None = None
        if self._count_free_now() >= needed:
            result = self._try_now(job, end)
            if isinstance(result, Placement) and self._pending:
                # Jobs ahead of it wait with no reservation yet: make theirs, then it must keep clear of them.
                self._reserve_pending()
                result = self._try_now(job, end)
            if isinstance(result, Placement):
                self._started_now(job, result, end)
                return result
        never = self._never(job.shape)
        if never is not None:
            self.outcome.never[job.job_id] = never
            return None
        self._pending.append((job, result if isinstance(result, Unplaceable) else None))
        return None

    def finish(self, *, plan_all: bool) -> None:
        """End the pass: with `plan_all`, every waiting job still without a reservation gets one (up to the depth);
        without, they are left as they were (`outcome.deferred`)."""
        if plan_all:
            self._reserve_pending(afresh=True)
        else:
            self.outcome.deferred = [job.job_id for job, _why in self._pending]
            self._pending.clear()

    def _try_now(self, job: Waiting, end: float) -> Placement | Unplaceable:
        held = self._held_over(self.now, end)
        # A shape that did not fit these very states (no job started since) with the same devices held does not fit
        # now either: on a busy fleet most of the queue is such repeats.
        seen = (job.shape, tuple(sorted(held.items())))
        if seen in self._misfits:
            return self._misfits[seen]
        result = place(job.shape, _block(self.states, held), fits_empty=True, packing=self.packing)
        if isinstance(result, Unplaceable):
            self._misfits[seen] = result
        return result

    def _reserve_pending(self, *, afresh: bool = False) -> None:
        for job, why in self._pending:
            reservation = None
            if len(self.outcome.reservations) < self.depth:
                kept = None if afresh else self._previous.get(job.job_id)
                if kept is not None and kept.end - kept.start == job.limit_s and self._still_holds(kept):
                    reservation = kept
                else:
                    reservation = self._reserve(job, _needed(job.shape))
            if reservation is None:
                self.outcome.unplaced[job.job_id] = why
            else:
                self.outcome.reservations[job.job_id] = reservation
        self._pending.clear()

    def _started_now(self, job: Waiting, where: Placement, end: float) -> None:
        self.outcome.started.append((job, where))
        self.states = self._take(self.states, where)
        if self._free_now is not None:
            online = {state.name for state in self.states if state.online}
            self._free_now -= sum(len(task.devices) for task in where.tasks if task.host in online)
        self._misfits.clear()
        self._release_at = None
        gang = Running(job.job_id, end, devices_of(where))
        if self._running is None:
            self._started.append(gang)
        else:
            self._running.append(gang)
            self._running.sort(key=lambda r: r.ends_at)

    def _still_holds(self, reservation: Reservation) -> bool:
        """Whether a reservation made earlier can still be kept: it starts in the future, each of its devices is free
        now or freed by a running gang that ends by its start, and no reservation made this pass overlaps it."""
        if reservation.start < self.now:
            return False
        if self._release_at is None:
            self._release_at = {
                (host, device): gang.ends_at
                for gang in self.running
                for host, ids in gang.devices.items()
                for device in ids
            }
        by_name = {state.name: state for state in self.states}
        held = self._held_over(reservation.start, reservation.end)
        for host, ids in reservation.devices.items():
            state = by_name.get(host)
            if state is None or not state.online or ids & held.get(host, frozenset()):
                return False
            for device in ids & state.used_devices:
                if self._release_at.get((host, device), float("inf")) > reservation.start:
                    return False
        return True

    def _reserve(self, job: Waiting, needed: int) -> Reservation | None:
        """The earliest release time at which the gang fits, and where. Walks the releases in time order keeping only
        sets of freed devices and a count of free ones: host states are built, and a full placement tried, only at
        times when enough devices are free (minus what reservations hold then), at most RESERVE_TRIES times."""
        running = self.running
        used = {state.name: state.used_devices for state in self.states if state.online}
        freed: dict[str, set[int]] = {}
        free_count = self._count_free_now()
        ends = sorted({r.ends_at for r in running} | {r.end for r in self.outcome.reservations.values()})
        released = 0  # running is sorted by end: what ended by `at` is a prefix of it
        tries = 0
        for at in ends:
            while released < len(running) and running[released].ends_at <= at:
                for host, ids in running[released].devices.items():
                    if host in used:  # an offline host's devices free nothing
                        mine = freed.setdefault(host, set())
                        more = (ids & used[host]) - mine
                        mine |= more
                        free_count += len(more)
                released += 1
            if at < self.now:
                continue  # (a gang due now but not yet gone is what a reservation at `now` waits for)
            held = self._held_over(at, at + job.limit_s)
            if free_count - sum(len(ids) for ids in held.values()) < needed:
                continue
            tries += 1
            states = _block(free(self.states, _frozen(freed)), held)
            result = place(job.shape, states, fits_empty=True, packing=self.packing)
            if isinstance(result, Placement):
                return Reservation(job.job_id, at, at + job.limit_s, devices_of(result))
            if tries >= RESERVE_TRIES:
                return None
        return None


# Placements a reservation may try (each a full placement over the fleet): a gang that fits nowhere at that many
# release times gets no estimate this pass rather than making the pass slow.
RESERVE_TRIES = 40
_IDLE_VERDICTS: dict[tuple[int, JobShape], Unplaceable | None] = {}
