"""Backfill over reservations (Slurm's backfill, conservative to a depth): which waiting gangs start now, and when the
others will at the latest. Plain Python, no Django: orchestrator/scheduler/scheduling.py turns rows into these and
writes the outcome back. The plan's terms (running gangs, waiting jobs, reservations) are in
orchestrator/core/backfill_terms.py, the lookups a pass keeps in orchestrator/core/backfill_lookups.py.

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

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter

from orchestrator.core.assignment import Packing
from orchestrator.core.backfill_lookups import ENDS_AT, PassLookups
from orchestrator.core.backfill_terms import (
    Devices,
    Outcome,
    Reservation,
    Running,
    Waiting,
    block,
    devices_of,
    free,
    frozen,
)
from orchestrator.core.hosts import HostState
from orchestrator.core.placement import Placement, Unplaceable, place
from orchestrator.core.shapes import JobShape, device_tasks, devices_needed, fit_count


class Planner(PassLookups):
    """One pass's plan. `take` marks a started job's ports and devices used in the states (placement.take: the
    states, the placement and, optionally, each host's index in the states)."""

    def __init__(
        self,
        states: Sequence[HostState],
        running: Sequence[Running] | Callable[[], Sequence[Running]],
        *,
        now: float,
        depth: int,
        take: Callable[..., list[HostState]],
        previous: dict[int, Reservation] | None = None,
        packing: Packing = Packing.SPREAD,
    ) -> None:
        # In name order, as placement sorts them (so it need not sort them for every job: `ordered`); `take` keeps it.
        self.states = sorted(states, key=_NAME)
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
        self._misfits: dict[tuple[JobShape, tuple[int, ...]], Unplaceable | None] = {}
        self._shape_facts: dict[JobShape, _ShapeFacts] = {}
        self._held_cache: dict[tuple[int, ...], Devices] = {}
        self._blocked: dict[tuple[int, ...], list[HostState]] = {}
        # The states by host name, and per devices-per-task the sum of `fit_count` over the online hosts: made when
        # first asked, then kept up to date as jobs start (_started_now).
        self._by_name: dict[str, HostState] | None = None
        self._position: dict[str, int] | None = None
        self._fit_sums: dict[int, int] = {}
        self._held_loss: dict[tuple[int, tuple[int, ...]], int] = {}  # _fits_by_count's, until a job starts
        # _overlapping_now's reservation starts and prefixes, until a reservation is made
        self._overlaps_now: tuple[list[float], list[tuple[int, ...]]] | None = None
        self._blocked_hosts: dict[tuple[str, frozenset[int]], tuple[HostState, HostState]] = {}  # _block_now's

    def offer(self, job: Waiting) -> Placement | None:
        """Start `job` now if it may (the placement), else leave it waiting (None). Its reservation is made only
        when it is needed: when a job behind it fits now (it must keep clear of it), or at `finish` when the pass
        plans every waiting job's start. A pass over a full fleet where nothing fits then costs little."""
        shape = job.shape
        facts = self._shape_facts.get(shape) or self._facts_of(shape)
        result: Placement | Unplaceable | None = None
        if self._count_free_now() >= facts.needed and not self._too_few_fits(shape, facts):
            end = self.now + job.limit_s
            seen = (shape, self._overlapping_now(end))
            if seen in self._misfits:
                # It did not fit these very states (no job started since) with the same reservations in its way: on
                # a busy fleet most of the queue is such repeats. (What _may_fit_now and _try_now would answer.)
                result = self._misfits[seen]
            elif not self._pending:
                result = self._try_now(job, end)
            elif self._may_fit_now(job, end):
                # Jobs ahead of it wait with no reservation yet: make theirs, then it must keep clear of them.
                self._reserve_pending()
                result = self._try_now(job, end)
            else:  # (what _may_fit_now found is kept: the same reservations are in its way)
                result = self._misfits[seen]
            if isinstance(result, Placement):
                self._started_now(job, result, end)
                return result
        if not facts.asked:
            facts.never, facts.asked = self._never(shape), True
        if facts.never is not None:
            self.outcome.never[job.job_id] = facts.never
            return None
        self._pending.append((job, result if isinstance(result, Unplaceable) else None))
        return None

    def _facts_of(self, shape: JobShape) -> _ShapeFacts:
        """What the pass asks of every waiting job's shape, once per shape (a queue has a few dozen)."""
        facts = self._shape_facts[shape] = _ShapeFacts(devices_needed(shape), device_tasks(shape))
        return facts

    def finish(self, *, plan_all: bool) -> None:
        """End the pass: with `plan_all`, every waiting job still without a reservation gets one (up to the depth);
        without, they are left as they were (`outcome.deferred`)."""
        if plan_all:
            self._reserve_pending(afresh=True)
        else:
            self.outcome.deferred = [job.job_id for job, _why in self._pending]
            self._pending.clear()

    def _too_few_fits(self, shape: JobShape, facts: _ShapeFacts) -> bool:
        """Whether the online hosts' free devices, reservations aside, hold fewer of the shape's device tasks than it
        has: then nothing placed or reserved later in the pass makes room (both only take devices), whatever its
        labels. On a busy spread fleet most of the queue is ruled out here, at the cost of a lookup."""
        return COUNT_FIRST and self._fit_sum(shape.devices_per_worker) < facts.device_tasks

    def _may_fit_now(self, job: Waiting, end: float) -> bool:
        """Whether `job` fits now as far as the reservations made so far go. A label-free shape is answered by the
        count (`_fits_by_count`: exact, ports aside), so a job that fits is placed once, after the jobs ahead of it
        get their reservations; any other shape by a placement, which is tried again once they have them. (Asked by
        `offer` of a job that is no kept misfit: it keeps the misfit it finds.)"""
        if not (COUNT_FIRST and not job.shape.labels):
            return isinstance(self._try_now(job, end), Placement)
        reserved = self._overlapping_now(end)
        if self._fits_by_count(job.shape, reserved):
            return True
        self._misfits[(job.shape, reserved)] = None
        return False

    def _try_now(self, job: Waiting, end: float) -> Placement | Unplaceable | None:
        """Where `job` starts now (keeping clear of the reservations over its run), or why it cannot: a placement's
        reason, or None when the free device counts already rule it out (`_fits_by_count`)."""
        reserved = self._overlapping_now(end)
        # A shape that did not fit these very states (no job started since) with the same reservations in its way
        # does not fit now either: on a busy fleet most of the queue is such repeats.
        seen = (job.shape, reserved)
        if seen in self._misfits:
            return self._misfits[seen]
        counted = COUNT_FIRST and not job.shape.labels  # a label-free shape is counted first; then place() need not
        if counted and not self._fits_by_count(job.shape, reserved):
            # Counted first: most shapes that reach here still do not fit, and a count is a fraction of a placement.
            # (No reason is made for these: a job the pass does not reserve for says it waits its turn.)
            self._misfits[seen] = None
            return None
        if reserved not in self._blocked:  # the states with these reservations' devices taken (kept up by starts)
            self._blocked[reserved] = self._block_now(reserved)
        result = place(
            job.shape, self._blocked[reserved], fits_empty=True, packing=self.packing, counted=counted, ordered=True
        )
        if isinstance(result, Unplaceable):
            self._misfits[seen] = result
        return result

    def _fits_by_count(self, shape: JobShape, reserved: tuple[int, ...]) -> bool:
        """Whether a label-free shape may fit now by the online hosts' free device counts, the devices these
        reservations hold taken out (shapes.fits_free_counts; a placement then says for sure). What the held
        devices take off the count is kept per (devices per task, reservations) until a job starts: most of a busy
        queue asks it of the same few, and a wide reservation spans dozens of hosts."""
        d = shape.devices_per_worker
        key = (d, reserved)
        if key not in self._held_loss:
            by_name = self._states_by_name()
            loss = 0
            for host, ids in self._held_by(reserved).items():
                state = by_name.get(host)
                if state is not None and state.online:
                    free = len(state.free_devices)
                    loss += fit_count(d, free) - fit_count(d, free - len(ids.intersection(state.free_devices)))
            self._held_loss[key] = loss
        return self._fit_sum(d) - self._held_loss[key] >= device_tasks(shape)

    def _reserve_pending(self, *, afresh: bool = False) -> None:
        for job, why in self._pending:
            reservation = None
            if len(self.outcome.reservations) < self.depth:
                kept = None if afresh else self._previous.get(job.job_id)
                if kept is not None and kept.end - kept.start == job.limit_s and self._still_holds(kept):
                    reservation = kept
                else:
                    reservation = self._reserve(job)
            if reservation is None:
                self.outcome.unplaced[job.job_id] = why
            else:
                self.outcome.reservations[job.job_id] = reservation
                self._overlaps_now = None
        self._pending.clear()

    def _started_now(self, job: Waiting, where: Placement, end: float) -> None:
        self.outcome.started.append((job, where))
        by_name = self._states_by_name()
        before = {task.host: by_name[task.host] for task in where.tasks}
        position = self._positions()
        self.states = self._take(self.states, where, position)
        # The counts kept over all hosts change only on the hosts the job took: updated there, not counted again (a
        # pass that starts dozens of jobs would recount 500 hosts for each).
        for host, old in before.items():
            new = by_name[host] = self.states[position[host]]
            if not new.online:
                continue
            was, now = len(old.free_devices), len(new.free_devices)
            if self._free_now is not None:
                self._free_now -= was - now
            for d in self._fit_sums:
                self._fit_sums[d] += fit_count(d, now) - fit_count(d, was)
        # A shape the count ruled out stays out for the rest of the pass (starts and reservations only take devices);
        # a placement's verdict is asked again.
        self._misfits = {seen: why for seen, why in self._misfits.items() if why is None} if COUNT_FIRST else {}
        # The blocked states kept per set of reservations change where the job landed only (a pass that starts dozens
        # of jobs would block every host again for each set, after each start).
        for reserved, blocked in self._blocked.items():
            held = self._held_by(reserved)
            for host in before:
                state = by_name[host]  # (its new state, set above)
                blocked[position[host]] = self._blocked_host(state, held[host]) if host in held else state
        self._held_loss.clear()
        gang = Running(job.job_id, end, devices_of(where))
        if self._release_at is not None:  # the devices it took were free: none of them had a release time
            self._release_at.update({(host, device): end for host, ids in gang.devices.items() for device in ids})
        if self._running is None:
            self._started.append(gang)
        else:
            bisect.insort(self._running, gang, key=ENDS_AT)  # after equal ends, as a stable sort would put it

    def _still_holds(self, reservation: Reservation) -> bool:
        """Whether a reservation made earlier can still be kept: it starts in the future, each of its devices is free
        now or freed by a running gang that ends by its start, and no reservation made this pass overlaps it."""
        if reservation.start < self.now:
            return False
        if self._release_at is None:
            # Only the hosts kept reservations name are asked about: a busy fleet's gangs hold thousands of devices.
            asked = {host for kept in self._previous.values() for host in kept.devices}
            self._release_at = {
                (host, device): gang.ends_at
                for gang in self.running
                for host, ids in gang.devices.items()
                if host in asked
                for device in ids
            }
        by_name = self._states_by_name()
        held = self._held_over(reservation.start, reservation.end)
        for host, ids in reservation.devices.items():
            state = by_name.get(host)
            if state is None or not state.online or ids & held.get(host, frozenset()):
                return False
            for device in ids & state.used_devices:
                if self._release_at.get((host, device), float("inf")) > reservation.start:
                    return False
        return True

    def _reserve(self, job: Waiting) -> Reservation | None:
        """The earliest release time at which the gang fits, and where. Walks the releases in time order keeping, per
        host its labels allow, the devices freed and the count of free ones: a full placement is tried only at times
        when those counts hold the gang (minus what reservations hold then; shapes.fits_free_counts), at most
        RESERVE_TRIES times."""
        running = self.running
        shape = job.shape
        d, want = shape.devices_per_worker, device_tasks(shape)
        usable = {state.name: state for state in self.states if state.online and shape.labels <= state.labels}
        used = {name: state.used_devices for name, state in usable.items()}
        counts = {name: len(state.free_devices) for name, state in usable.items()}
        fits = sum(fit_count(d, c) for c in counts.values())
        freed: dict[str, set[int]] = {}
        ends = sorted({r.ends_at for r in running} | {r.end for r in self.outcome.reservations.values()})
        released = 0  # running is sorted by end: what ended by `at` is a prefix of it
        tries = 0
        for at in ends:
            while released < len(running) and running[released].ends_at <= at:
                for host, ids in running[released].devices.items():
                    if host in used:  # an offline host's (or one its labels rule out) frees nothing it could use
                        mine = freed.setdefault(host, set())
                        more = (ids & used[host]) - mine
                        if more:
                            mine |= more
                            fits -= fit_count(d, counts[host])
                            counts[host] += len(more)
                            fits += fit_count(d, counts[host])
                released += 1
            if at < self.now:
                continue  # (a gang due now but not yet gone is what a reservation at `now` waits for)
            held = self._held_over(at, at + job.limit_s)
            room = fits
            for host, ids in held.items():
                if host in usable:
                    blocked = len(ids.intersection(usable[host].free_devices)) + len(ids & freed.get(host, set()))
                    room -= fit_count(d, counts[host]) - fit_count(d, counts[host] - blocked)
            if COUNT_FIRST and room < want:
                continue
            tries += 1
            states = block(free(self.states, frozen(freed)), held)
            result = place(shape, states, fits_empty=True, packing=self.packing, counted=COUNT_FIRST, ordered=True)
            if isinstance(result, Placement):
                return Reservation(job.job_id, at, at + job.limit_s, devices_of(result))
            if tries >= RESERVE_TRIES:
                return None
        return None


@dataclass(slots=True)
class _ShapeFacts:
    needed: int  # devices_needed
    device_tasks: int
    asked: bool = False  # whether `never` holds Planner._never's answer yet
    never: Unplaceable | None = None


# Count free devices before trying a placement (shapes.fits_free_counts): exact, so it changes no plan, only its
# cost (tests/orchestrator/core/test_backfill.py turns it off to show that).
COUNT_FIRST = True
# Placements a reservation may try (each a full placement over the fleet): a gang that fits nowhere at that many
# release times gets no estimate this pass rather than making the pass slow.
RESERVE_TRIES = 40
_NAME = attrgetter("name")
