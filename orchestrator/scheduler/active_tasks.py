"""What a cluster's active tasks hold: ports and devices per host, gangs and when they let their devices go, devices
per owner. Read for every scheduler pass, so read cheaply: a task's host, port, devices, job, owner and placement
never change once its row is written, so a pass keeps them (in this process, per cluster) and asks PostgreSQL each
time only which tasks are active, which of them are being stopped, and their jobs' time limits (staff may change
one); the facts of tasks it has not seen yet come in a second query. Reading every active task's row whole and
walking its JSON list was most of a small pass on a busy fleet (bench/pass_cost.py)."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from typing import Any, NamedTuple

from django.db import connection

from orchestrator.core import backfill_terms
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
    ports: dict[int, list[int]]  # host id -> ports of its active tasks
    devices: dict[int, list[int]]  # host id -> devices of its active tasks
    gangs: list[backfill_terms.Running]
    usage: dict[int, int]  # owner id -> devices
    held_since: dict[int, dict[float, int]]  # owner id -> placement time -> devices held since (fair share's memory)


def read(host_ids: list[int], cache_key: int | None = None) -> list[Active]:
    """The active tasks on these hosts. `cache_key` (a cluster id): keep their facts between calls in this process."""
    with connection.cursor() as cursor:
        cursor.execute(_ACTIVE_SQL, [str(TaskState.STOPPING), host_ids, [str(state) for state in ACTIVE_TASK_STATES]])
        rows: list[tuple[int, bool, int]] = cursor.fetchall()
    cache = _caches.setdefault(cache_key, _Cache()) if cache_key is not None else _Cache()
    with cache.lock:
        facts = cache.facts
        missing = [task_id for task_id, _stopping, _limit in rows if task_id not in facts]
        if missing:
            facts.update(_facts(missing))
        if len(facts) > 2 * len(rows) + 1000:  # mostly ended tasks: keep what is active (never active again)
            cache.facts = facts = {task_id: facts[task_id] for task_id, _s, _l in rows if task_id in facts}
    return [(facts[task_id], stopping, limit) for task_id, stopping, limit in rows if task_id in facts]


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
    held_since: dict[int, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    for (job_id, host_id, port, ids, placed_at, owner_id), stopping, limit in tasks:
        if port is not None:
            ports[host_id].append(port)
        if ids:
            devices[host_id].extend(ids)
            usage[owner_id] += len(ids)
            if placed_at is not None:
                held_since[owner_id][placed_at] += len(ids)
            on, name = held[job_id], names[host_id]
            on[name] = on[name] | ids if name in on else ids
        end = soonest if stopping or placed_at is None else max(soonest, placed_at + limit + grace)
        if end > ends.get(job_id, float("-inf")):
            ends[job_id] = end
    gangs = [backfill_terms.Running(job_id, end, held.get(job_id, {})) for job_id, end in ends.items()]
    return Held(ports, devices, gangs, dict(usage), {owner: dict(since) for owner, since in held_since.items()})


class _Cache:
    def __init__(self) -> None:
        self.facts: dict[int, Facts] = {}
        self.lock = threading.Lock()  # a process's passes over one cluster take turns (its row lock) but pages read too


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
