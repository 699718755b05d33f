"""The ingest's caches: hosts by name (a few seconds, so a new token takes effect quickly) and tasks by id (what the
ingest checks of a task row never changes; only tasks found: a miss is read again, so a task created after a report
named it still gets its later points), and the one check every task report passes: right host, right task,
right attempt. Reading them per report was most of a small report's cost (measured: 1.5 to 3.9 ms to authenticate,
plus the task lookup, for about 8 ms a one-point message)."""

from __future__ import annotations

import time
from typing import Any

from orchestrator import counters
from orchestrator.agents import auth
from orchestrator.models import Host, Task

DROPPED = "metric_events_dropped"
# A rotated token or a deleted host takes effect for the ingest within this long.
HOST_CACHE_S = 5.0
MAX_CACHED_TASKS = 20_000


class _Lookups:
    """Hosts by name (briefly, token changes must take effect) and tasks by id (what the ingest checks never changes
    on a task row: job, attempt, host, type, index)."""

    def __init__(self) -> None:
        self.hosts: dict[str, tuple[float, Host | None]] = {}
        self.tasks: dict[int, Task] = {}

    def host(self, name: str, token: str) -> Host | None:
        """The host called `name` if `token` is its token. A cached host whose token does not match is read again:
        a new token works at once; the replaced one keeps working for at most HOST_CACHE_S."""
        now = time.monotonic()
        hit = self.hosts.get(name)
        if hit is not None and hit[0] > now and hit[1] is not None and hit[1].check_token(token):
            return hit[1]
        if hit is not None and hit[0] > now and hit[1] is None:
            return None  # an unknown name, seen lately: a flood of forged reports does not reach the database
        if len(self.hosts) > 10_000:  # names from forged reports must not grow this without bound
            self.hosts.clear()
        host = Host.objects.filter(name=name).first()
        self.hosts[name] = (now + HOST_CACHE_S, host)
        return host if host is not None and host.check_token(token) else None

    def task(self, task_id: int) -> Task | None:
        """The task with this id. A miss is never cached: an id unknown now may be a task created a moment later (a
        cached miss made every later point of that task vanish). Only an authenticated host reaches this, so misses
        cost one primary-key read each, not a forger's flood."""
        task = self.tasks.get(task_id)
        if task is None:
            task = Task.objects.filter(pk=task_id).select_related("job").first()
            if task is not None:
                if len(self.tasks) >= MAX_CACHED_TASKS:
                    self.tasks.clear()
                self.tasks[task_id] = task
        return task

    def forget(self) -> None:
        self.hosts.clear()
        self.tasks.clear()


lookups = _Lookups()


def task_of(payload: Any, body_type: type) -> tuple[Task, Any] | None:
    found = auth.authenticated_body(payload, body_type, lookups.host)
    if found is None:
        return None
    host, body = found
    task = lookups.task(body.task_id) if isinstance(body.task_id, int) else None
    if task is None or task.attempt != body.attempt or task.host_id != host.pk:
        counters.incr(DROPPED)
        return None
    return task, body
