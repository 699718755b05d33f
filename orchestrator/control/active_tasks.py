"""What a cluster's active tasks hold: ports and devices per host, gangs and when they let their devices go, devices
per owner. Read for every scheduler pass, so read cheaply: a task's host, port, devices, job, owner and placement
never change once its row is written, so a pass keeps them (in this process, per cluster) and asks PostgreSQL each
time only which tasks are active, which of them are being stopped, and their jobs' time limits (staff may change
one); the facts of tasks it has not seen yet come in a second query. Reading every active task's row whole and
walking its JSON list was most of a small pass on a busy fleet (bench/pass_cost.py)."""

from __future__ import annotations

import json
import threading
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from typing import Any, NamedTuple

from django.db import connection

from orchestrator.core import backfill
from orchestrator.models import ACTIVE_TASK_STATES, Job, Task, TaskState


class Facts(NamedTuple):
    """What never changes about a task once its row is written."""

    job_id: int
    host_id: int
    port: int | None
    devices: frozenset[int]
    placed_at: float | None  # its job's placement that started it (epoch seconds)
    owner_id: int


# An active task: its facts, whether it is being stopped, and its job's time limit now.
Active = tuple[Facts, bool, int]


class Held(NamedTuple):
    ports: Mapping[int, Collection[int]]  # host id -> ports of its active tasks
    devices: Mapping[int, Collection[int]]  # host id -> devices of its active tasks
    gangs: list[backfill.Running]
    usage: dict[int, int]  # owner id -> devices


def read(host_ids: list[int], cache_key: int | None = None) -> list[Active]:
    """The active tasks on these hosts. `cache_key` (a cluster id): keep their facts between calls in this process."""
    rows = _active_rows(host_ids)
    cache = _caches.setdefault(cache_key, _Cache()) if cache_key is not None else _Cache()
    with cache.lock:
        facts = cache.known(rows)
    return [(facts[task_id], stopping, limit) for task_id, stopping, limit in rows if task_id in facts]


def held_now(host_ids: list[int], names: dict[int, str], now: float, grace: float, cache_key: int) -> Held:
    """What the active tasks on these hosts hold, as `tally` counts it, from a tally kept in this process per
    `cache_key` (a cluster id) and moved by what changed since the last call: the tasks that became active or ended,
    and those whose stop began or whose job's limit changed. A scheduler pass asks this of every active task of a
    busy fleet (thousands), and a pass's worth of gangs ending and starting is a tenth of them: walking them all
    again, and rebuilding every host's sets, was a fifth of a pass (bench/pass_cost.py)."""
    rows = _active_rows(host_ids)
    cache = _caches.setdefault(cache_key, _Cache())
    with cache.lock:
        facts = cache.known(rows)
        if names != cache.tally.names:  # a host renamed, added or removed: counted afresh
            cache.tally = _Tally(names)
        return cache.tally.update(rows, facts, now, grace)


def _active_rows(host_ids: list[int]) -> list[tuple[int, bool, int]]:
    with connection.cursor() as cursor:
        cursor.execute(_ACTIVE_SQL, [str(TaskState.STOPPING), host_ids, [str(state) for state in ACTIVE_TASK_STATES]])
        return cursor.fetchall()


def tally(tasks: list[Active], names: dict[int, str], now: float, grace: float) -> Held:
    """What the tasks hold, per host, per gang and per owner, in one walk. A gang lets its devices go at the latest
    at its placement plus its time limit plus `grace` (the watchdog stops it there: fleet_state.release_margin), or,
    already being stopped, `grace` from now."""
    soonest = now + grace  # a gang past its limit, or being stopped, is gone within the grace
    ports: dict[int, list[int]] = defaultdict(list)
    devices: dict[int, list[int]] = defaultdict(list)
    ends: dict[int, float] = {}
    held: dict[int, dict[str, frozenset[int]]] = defaultdict(dict)
    usage: dict[int, int] = defaultdict(int)
    for (job_id, host_id, port, ids, placed_at, owner_id), stopping, limit in tasks:
        if port is not None:
            ports[host_id].append(port)
        if ids:
            devices[host_id].extend(ids)
            usage[owner_id] += len(ids)
            on, name = held[job_id], names[host_id]
            on[name] = on[name] | ids if name in on else ids
        end = soonest if stopping or placed_at is None else max(soonest, placed_at + limit + grace)
        if end > ends.get(job_id, float("-inf")):
            ends[job_id] = end
    gangs = [backfill.Running(job_id, end, held.get(job_id, {})) for job_id, end in ends.items()]
    return Held(ports, devices, gangs, dict(usage))


class _Gang:
    """One job's active tasks in a kept tally: what they hold per host name (a multiset of devices: a device counts
    as held while any of them holds it) and, per task, what its end depends on."""

    __slots__ = ("ends", "held", "held_frozen", "latest", "stale")

    def __init__(self) -> None:
        self.ends: dict[int, tuple[bool, float | None, int]] = {}  # task id -> (stopping, placed_at, its job's limit)
        self.held: dict[str, Counter[int]] = {}
        self.held_frozen: dict[str, frozenset[int]] | None = None  # `held`'s keys, made when asked after a change
        self.latest: float | None = None  # `end`'s latest placement plus limit of a task not being stopped
        self.stale = True  # `latest` is to be found again (`ends` changed)

    def frozen(self) -> dict[str, frozenset[int]]:
        if self.held_frozen is None:
            self.held_frozen = {name: frozenset(ids) for name, ids in self.held.items()}
        return self.held_frozen

    def end(self, soonest: float, grace: float) -> float:
        """When the gang lets its devices go at the latest: `tally`'s rule, its latest task's end. A task being stopped
        (or never placed) ends by `soonest`; any other by its placement plus its limit plus `grace`, or `soonest`."""
        if self.stale:
            ends = self.ends.values()
            live = [placed + limit for stopping, placed, limit in ends if not stopping and placed is not None]
            self.latest, self.stale = max(live, default=None), False
        return soonest if self.latest is None else max(soonest, self.latest + grace)


class _Tally:
    """`tally`'s answer for a cluster, kept between passes and moved task by task (held_now)."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = dict(names)  # host id -> name: gangs hold devices by host name
        self.active: dict[int, tuple[Facts, bool, int]] = {}  # task id -> its facts, stopping, its job's limit
        self.ports: dict[int, Counter[int]] = {}  # host id -> ports of its active tasks (a multiset)
        self.devices: dict[int, Counter[int]] = {}
        self.frozen_ports: dict[int, frozenset[int]] = {}  # the multisets' keys, made again when the host changes
        self.frozen_devices: dict[int, frozenset[int]] = {}
        self.gangs: dict[int, _Gang] = {}
        self.usage: Counter[int] = Counter()

    def update(self, rows: list[tuple[int, bool, int]], facts: dict[int, Facts], now: float, grace: float) -> Held:
        """Move the tally to these active tasks (`rows`: id, being stopped, its job's limit) and say what they hold."""
        current = {task_id: (stopping, limit) for task_id, stopping, limit in rows if task_id in facts}
        for task_id in self.active.keys() - current.keys():
            self._remove(task_id)
        for task_id, (stopping, limit) in current.items():
            was = self.active.get(task_id)
            if was is None:
                self._add(task_id, facts[task_id], stopping, limit)
            elif (was[1], was[2]) != (stopping, limit):
                self.active[task_id] = (was[0], stopping, limit)
                gang = self.gangs[was[0].job_id]
                gang.ends[task_id], gang.stale = (stopping, was[0].placed_at, limit), True
        soonest = now + grace
        return Held(
            dict(self.frozen_ports),  # (copies: the next update changes these)
            dict(self.frozen_devices),
            [backfill.Running(job_id, gang.end(soonest, grace), gang.frozen()) for job_id, gang in self.gangs.items()],
            dict(self.usage),
        )

    def _add(self, task_id: int, facts: Facts, stopping: bool, limit: int) -> None:
        self.active[task_id] = (facts, stopping, limit)
        gang = self.gangs.get(facts.job_id) or self.gangs.setdefault(facts.job_id, _Gang())
        gang.ends[task_id], gang.stale = (stopping, facts.placed_at, limit), True
        host = facts.host_id
        if facts.port is not None:
            _count(self.ports, self.frozen_ports, host, (facts.port,), 1)
        if facts.devices:
            _count(self.devices, self.frozen_devices, host, facts.devices, 1)
            self.usage[facts.owner_id] += len(facts.devices)
            _counted(gang.held.setdefault(self.names[host], Counter()), facts.devices, 1)
            gang.held_frozen = None

    def _remove(self, task_id: int) -> None:
        facts, _stopping, _limit = self.active.pop(task_id)
        gang = self.gangs[facts.job_id]
        del gang.ends[task_id]
        gang.stale = True
        host = facts.host_id
        if facts.port is not None:
            _count(self.ports, self.frozen_ports, host, (facts.port,), -1)
        if facts.devices:
            _count(self.devices, self.frozen_devices, host, facts.devices, -1)
            self.usage[facts.owner_id] -= len(facts.devices)
            if not self.usage[facts.owner_id]:
                del self.usage[facts.owner_id]
            name = self.names[host]
            if not _counted(gang.held[name], facts.devices, -1):
                del gang.held[name]
            gang.held_frozen = None
        if not gang.ends:
            del self.gangs[facts.job_id]


def _count(
    counts: dict[int, Counter[int]], frozen: dict[int, frozenset[int]], host: int, values: Iterable[int], by: int
) -> None:
    """Add (`by` 1) or take away (-1) `values` on a host's multiset, and make its frozen keys again."""
    held = counts.setdefault(host, Counter())
    if _counted(held, values, by):
        frozen[host] = frozenset(held)
    else:
        del counts[host]
        frozen.pop(host, None)


def _counted(held: Counter[int], values: Iterable[int], by: int) -> bool:
    """Add or take away `values` on a multiset, dropping what reaches 0; whether anything is left."""
    for value in values:
        held[value] += by
        if not held[value]:
            del held[value]
    return bool(held)


class _Cache:
    def __init__(self) -> None:
        self.facts: dict[int, Facts] = {}
        self.tally = _Tally({})  # held_now's
        self.lock = threading.Lock()  # a process's passes over one cluster take turns (its row lock) but pages read too

    def known(self, rows: list[tuple[int, bool, int]]) -> dict[int, Facts]:
        """The facts of these active tasks' (those not known yet read in one query); the rest of what it keeps is let
        go when most of it is of ended tasks (never active again). Called with the lock held."""
        missing = [task_id for task_id, _stopping, _limit in rows if task_id not in self.facts]
        if missing:
            self.facts.update(_facts(missing))
        if len(self.facts) > 2 * len(rows) + 1000:
            self.facts = {task_id: self.facts[task_id] for task_id, _s, _l in rows if task_id in self.facts}
        return self.facts


_caches: dict[int, _Cache] = {}

_ACTIVE_SQL = f"""
    SELECT t.id, t.state = %s, j.time_limit_s
    FROM {Task._meta.db_table} t
    JOIN {Job._meta.db_table} j ON j.id = t.job_id
    WHERE t.host_id = ANY(%s) AND t.state = ANY(%s)
"""  # noqa: S608 - table names from the models, every value a parameter

_FACTS_SQL = f"""
    SELECT t.id, t.job_id, t.host_id, t.port, t.devices::text, extract(epoch FROM j.placed_at)::float8, j.owner_id
    FROM {Task._meta.db_table} t
    JOIN {Job._meta.db_table} j ON j.id = t.job_id
    WHERE t.id = ANY(%s)
"""  # noqa: S608 - table names from the models, every value a parameter


def _facts(task_ids: list[int]) -> dict[int, Facts]:
    with connection.cursor() as cursor:
        cursor.execute(_FACTS_SQL, [task_ids])
        return {
            task_id: Facts(job_id, host_id, port, device_set(devices), placed_at, owner_id)
            for task_id, job_id, host_id, port, devices, placed_at, owner_id in cursor.fetchall()
        }


# Parsed JSON texts (GPU lists, device lists), by text: a fleet repeats a few of each thousands of times. Bounded.
_PARSED: dict[str, Any] = {}
_DEVICE_SETS: dict[str | None, frozenset[int]] = {}
_PARSED_MAX = 4096


def parsed(text: str | None) -> Any:
    """A JSON column's value from its text, decoded once per distinct text (callers must not change it)."""
    if text is None:
        return None
    if text not in _PARSED:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[text] = json.loads(text)
    return _PARSED[text]


def device_set(text: str | None) -> frozenset[int]:
    """A task's devices column: a JSON list of ids (anything else holds none, as placement wrote none)."""
    if text not in _DEVICE_SETS:
        if len(_DEVICE_SETS) >= _PARSED_MAX:
            _DEVICE_SETS.clear()
        value = parsed(text)
        _DEVICE_SETS[text] = frozenset(int(d) for d in value) if isinstance(value, list) else frozenset()
    return _DEVICE_SETS[text]
