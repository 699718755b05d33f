"""The ingest's caches: hosts and their MAC keys by name (a few seconds, so a new token takes effect quickly) and
tasks by id (what the ingest checks of a task row never changes; only tasks found: a miss is read again, so a task
created after a report named it still gets its later points), and the one check every task report passes: right
host, right task, right attempt. Reading them per report was most of a small report's cost (measured: 1.5 to 3.9 ms
to authenticate, plus the task lookup, for about 8 ms a one-point message)."""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple, TypeVar

from orchestrator.identity import auth, foreign, tokens
from orchestrator.identity.stream_marks import Appended
from orchestrator.models import Host, Task
from orchestrator.plumbing import counters
from orchestrator.plumbing.compiled_reads import CompiledRead

log = logging.getLogger(__name__)
T = TypeVar("T")

DROPPED = "metric_events_dropped"
# A rotated token or a deleted host takes effect for the ingest within this long.
HOST_CACHE_S = 5.0
MAX_CACHED_TASKS = 20_000


class _Lookups:
    """Hosts by name (briefly, token changes must take effect) and tasks by id (what the ingest checks never changes
    on a task row: job, attempt, host, type, index)."""

    def __init__(self) -> None:
        self.hosts: dict[str, tuple[float, Host | None, bytes | None]] = {}
        self.tasks: dict[int, Task] = {}

    def host(self, name: str, fresh: bool = False) -> tuple[Host | None, bytes | None]:
        """The host called `name` and its MAC key (decrypted once per HOST_CACHE_S, not per report); (None, None)
        for an unknown name, cached too, so a flood of forged reports does not reach the database. `fresh`: read
        again unless the name is unknown (auth asks when a cached key does not match: a new token works at once);
        the replaced key keeps working for at most HOST_CACHE_S."""
        now = time.monotonic()
        hit = self.hosts.get(name)
        if hit is not None and hit[0] > now and (not fresh or hit[1] is None):
            return hit[1], hit[2]
        if len(self.hosts) > 10_000:  # names from forged reports must not grow this without bound
            self.hosts.clear()
        found = _HOST_NAMED([name])
        host = found[0] if found else None
        key = tokens.mac_key(host) if host is not None else None
        self.hosts[name] = (now + HOST_CACHE_S, host, key)
        return host, key

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

    def prefetch(self, task_ids: set[int]) -> None:
        """Read the tasks among `task_ids` not cached yet in one query (a batch names thousands at fleet size)."""
        missing = [pk for pk in task_ids if pk not in self.tasks]
        if not missing:
            return
        if len(self.tasks) + len(missing) > MAX_CACHED_TASKS:
            self.tasks.clear()
        for task in Task.objects.filter(pk__in=missing[:MAX_CACHED_TASKS]).select_related("job"):
            self.tasks[task.pk] = task

    def forget(self) -> None:
        self.hosts.clear()
        self.tasks.clear()


# Compiled once (orchestrator/plumbing/compiled_reads.py): every host's entry is read again every HOST_CACHE_S, 100
# reads a second at 500 hosts, and compiling the query was most of each (`.first()` also sorted a unique name's one
# row).
_HOST_NAMED = CompiledRead(lambda names: Host.objects.filter(name__in=names).order_by())

lookups = _Lookups()


class TaskReport(NamedTuple):
    """A stream report about one task: the task, the report's body, and when the agent sealed it (its clock)."""

    task: Task
    body: Any
    sent_at: float


def host_of(payload: Any, name: str, body_type: type) -> tuple[Host, Any] | None:
    """The sending host and the body of a stream report `name`, or None (refused: logged and counted)."""
    found = auth.authenticated_body(payload, name, body_type, key_of=lookups.host, stream=True)
    return (found[0].host, found[1]) if found is not None else None


def opened(payload: Any, name: str, appended: Appended | None = None) -> auth.Accepted | None:
    """The sending host and the verified message of a stream report `name` (a bundle: contracts/bundles.py), or None
    (refused: logged and counted). `appended`: the stream entry it came in, whose age is measured to when Redis
    appended it and which must not be an earlier entry appended again (orchestrator/identity/stream_marks.py);
    None for a report handed over directly, whose age is measured to now."""
    at = None if appended is None else appended.at
    accepted = auth.authenticate(payload, name, key_of=lookups.host, stream=True, now=at)
    if accepted is None or appended is None:
        return accepted
    refused = appended.marks.admit(appended.host, appended.entry, accepted.message)
    if refused is not None:
        auth.note_refused(name, refused)
        return None
    return accepted


def body_as(host: Host, name: str, raw: Any, body_type: type[T]) -> T | None:
    """A verified report's body as `body_type`, or None (logged and counted)."""
    try:
        return body_type(**raw)
    except (KeyError, TypeError) as exc:
        log.warning("malformed %s from %s: %r", body_type.__name__, host.name, exc)
        counters.incr(auth.MALFORMED)
        return None


def task_of(payload: Any, name: str, body_type: type, appended: Appended | None = None) -> TaskReport | None:
    """The task a stream report `name` is about, checked: sealed by the task's own host, for its current attempt;
    else None (dropped: logged and counted). `appended`: as for `opened`."""
    accepted = opened(payload, name, appended)
    if accepted is None:
        return None
    return task_in(accepted.host, name, accepted.message.body, body_type, accepted.message.ts)


def task_in(host: Host, name: str, raw: Any, body_type: type, sent_at: float) -> TaskReport | None:
    """`task_of` for a report `host` sealed (alone or in a bundle) at `sent_at`: the task it is about, if that task is
    the host's own and the report is for its current attempt; else None (dropped: logged and counted)."""
    body = body_as(host, name, raw, body_type)
    if body is None:
        return None
    task = lookups.task(body.task_id) if isinstance(body.task_id, int) else None
    if task is not None and task.host_id is not None and task.host_id != host.pk:
        foreign.noted(host, f"a {str(name)[:40]} report", [task.pk])
        return None
    if task is None or task.attempt != body.attempt or task.host_id != host.pk:
        # Logged (a late report of an earlier attempt is expected after a restart; anything else is worth reading):
        # the chaos soak once lost one point with no drop it could see (session 51's note).
        why = "no such task" if task is None else f"the task is at attempt {task.attempt}, on host id {task.host_id}"
        log.info("dropped a %s of task %r attempt %r from %s: %s", str(name)[:40], body.task_id, body.attempt,
                 host.name, why)  # fmt: skip
        counters.incr(DROPPED)
        return None
    return TaskReport(task, body, sent_at)
