"""What a backfill pass looks up again and again, kept while it holds (`PassLookups`, the base of
orchestrator/core/backfill.py's `Planner`): the running gangs by end, the free devices now, whether a shape fits the
idle cluster at all, the reservations that overlap a window and the devices they hold, the host states with those
devices blocked, the states by name and position, and the free-device fit counts. Plain Python (no Django)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from operator import attrgetter

from orchestrator.core.backfill_terms import Devices, Outcome, Running, free_count, frozen, merge
from orchestrator.core.hosts import HostState
from orchestrator.core.placement import Unplaceable, place
from orchestrator.core.shapes import JobShape, fit_count


class PassLookups:
    """The Planner's cached lookups. Its state is made by `Planner.__init__` (orchestrator/core/backfill.py)."""

    states: list[HostState]
    now: float
    outcome: Outcome
    _running_source: Sequence[Running] | Callable[[], Sequence[Running]]
    _running: list[Running] | None
    _started: list[Running]
    _free_now: int | None
    _fleet: int | None
    _held_cache: dict[tuple[int, ...], Devices]
    _overlaps_now: tuple[list[float], list[tuple[int, ...]]] | None
    _blocked_hosts: dict[tuple[str, frozenset[int]], tuple[HostState, HostState]]
    _by_name: dict[str, HostState] | None
    _position: dict[str, int] | None
    _fit_sums: dict[int, int]

    @property
    def running(self) -> list[Running]:
        if self._running is None:
            source = self._running_source() if callable(self._running_source) else self._running_source
            self._running = sorted([*source, *self._started], key=ENDS_AT)
        return self._running

    def _count_free_now(self) -> int:
        """Free devices on online hosts now, reservations aside: a bound that rules most misfits out cheaply."""
        if self._free_now is None:
            self._free_now = free_count(self.states)
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
        return self._held_by(self._overlapping(start, end))

    def _overlapping_now(self, end: float) -> tuple[int, ...]:
        """The jobs whose reservations overlap a run from now to `end`: asked of every job the count does not rule
        out. Every reservation ends after now, so they are the ones that start before `end`: a prefix of the
        reservations by start, kept (with the starts) until a reservation is made."""
        if self._overlaps_now is None:
            ahead = sorted((r.start, r.job_id) for r in self.outcome.reservations.values() if self.now < r.end)
            self._overlaps_now = ([start for start, _job in ahead], [tuple(job for _s, job in ahead[:n])
                                                                      for n in range(len(ahead) + 1)])  # fmt: skip
        starts, prefixes = self._overlaps_now
        return prefixes[bisect.bisect_left(starts, end)]

    def _overlapping(self, start: float, end: float) -> tuple[int, ...]:
        """The jobs whose reservations overlap [start, end)."""
        return tuple(r.job_id for r in self.outcome.reservations.values() if r.start < end and start < r.end)

    def _held_by(self, reserved: tuple[int, ...]) -> Devices:
        """The devices these jobs' reservations hold, merged. A pass makes a job's reservation once, so the ids name
        the same devices all pass long: merged once per set of ids (a pass asks for a few sets, thousands of times)."""
        if reserved not in self._held_cache:
            held: dict[str, set[int]] = {}
            for job_id in reserved:
                merge(held, self.outcome.reservations[job_id].devices)
            self._held_cache[reserved] = frozen(held)
        return self._held_cache[reserved]

    def _block_now(self, reserved: tuple[int, ...]) -> list[HostState]:
        """The states now, with the devices these reservations hold marked used."""
        held = self._held_by(reserved)
        return [self._blocked_host(state, held[state.name]) if state.name in held else state for state in self.states]

    def _blocked_host(self, state: HostState, ids: frozenset[int]) -> HostState:
        """A host's state with `ids` marked used, kept for as long as its state and those devices are the same: sets of
        reservations share hosts, and every set asked after a start would otherwise copy every host it holds."""
        kept = self._blocked_hosts.get((state.name, ids))
        if kept is None or kept[0] is not state:
            kept = self._blocked_hosts[(state.name, ids)] = (state, state.with_used((), ids))
        return kept[1]

    def _states_by_name(self) -> dict[str, HostState]:
        if self._by_name is None:
            self._by_name = {state.name: state for state in self.states}
        return self._by_name

    def _positions(self) -> dict[str, int]:
        """Each host's place in `states` (`take` keeps the order)."""
        if self._position is None:
            self._position = {state.name: i for i, state in enumerate(self.states)}
        return self._position

    def _fit_sum(self, d: int) -> int:
        """The sum of `fit_count(d, ·)` over the online hosts' free devices now (kept up to date by _started_now)."""
        if d not in self._fit_sums:
            self._fit_sums[d] = sum(fit_count(d, len(s.free_devices)) for s in self.states if s.online)
        return self._fit_sums[d]


ENDS_AT = attrgetter("ends_at")
_IDLE_VERDICTS: dict[tuple[int, JobShape], Unplaceable | None] = {}
