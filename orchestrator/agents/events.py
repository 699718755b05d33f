"""Task events and log lines from agents: authenticated, then applied to the job's state machine or stored.

A task event is applied with its job row locked (then the task's), the order every lifecycle handler locks in, and
at most once: it carries the agent's event number, and the task keeps the newest number it applied. A host speaks only
for its own tasks: an event naming another host's task is dropped, logged and counted (identity/foreign.py).

The intake applies events in batches as it reads them from the hosts' streams (orchestrator/agents/intake.py):
authenticated in one round trip, then applied job by job, all of one job's events in one transaction under one lock
of its row. A gang's events arrive together (its tasks start, listen and end at about the same time): one at a time,
each waited on the lock the others held (the scale bench's orchestrator spent half its event time there) and asked
for a scheduler pass of its own.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, fields
from typing import Any

from django.conf import settings
from django.db import transaction

from contracts.protocol import TASK_EVENT
from contracts.task_messages import TaskEvent, TaskEventKind
from orchestrator.identity import auth, foreign
from orchestrator.identity.auth import Accepted, authenticated_body, remember
from orchestrator.jobs.task_events import SAVES_EVENT_SEQ, apply_event
from orchestrator.models import ACTIVE_TASK_STATES, Host, Job, Task
from orchestrator.models.row_locks import tasks_locked
from orchestrator.plumbing import counters
from orchestrator.plumbing.compiled_reads import CompiledRead
from orchestrator.plumbing.compiled_writes import save_fields
from orchestrator.plumbing.outages import TRANSIENT

log = logging.getLogger(__name__)

DROPPED = "task_messages_dropped"
REPLAYED = "task_events_replayed"
FAILED = "task_events_failed"  # a job's events whose handler raised (a bug): logged with its traceback, not retried
_EVENT_FIELDS = {f.name for f in fields(TaskEvent)}

# Events per batch, in the order read: large enough that a gang's events go together (one lock of its job); a read of
# up to 500 (orchestrator/agents/intake.py) is applied as several, each authenticated in one round trip.
MAX_BATCH = 50


def handle_task_event(payload: Any) -> bool:
    found = authenticated_body(payload, TASK_EVENT, TaskEvent)
    if found is None:
        return False
    accepted, event = found
    applied = _apply(accepted.host, event)
    remember(accepted)  # handled (an exception above leaves it to be retried)
    return applied


def handle_task_events(payloads: list[Any]) -> int:
    """A batch of sealed task events (in the order their hosts sent them): each is applied as `handle_task_event`
    would, all of one job's in one transaction with its row locked once. Returns how many were applied.

    A job's events are remembered (their nonces) once its transaction committed: an outage raises, and the batch's
    retry applies only what was not. A job whose handler raises anything else is logged and counted, and the other
    jobs' events in the batch are applied all the same."""
    found: list[tuple[Accepted, TaskEvent]] = []
    for accepted in auth.authenticate_batch(payloads, TASK_EVENT):
        try:
            found.append((accepted, TaskEvent(**accepted.message.body)))
        except (KeyError, TypeError) as exc:
            log.warning("malformed TaskEvent from %s: %r", accepted.host.name, exc)
            counters.incr(auth.MALFORMED)
    owners = _jobs_of(found)
    by_job: dict[int, list[tuple[Accepted, TaskEvent]]] = {}
    applied = 0
    for accepted, event in found:
        job_id = owners.get((event.task_id, accepted.host.pk)) if _number(event.task_id) else None
        if job_id is None:  # unknown, or another host's task: the one-event path says which, logs and counts it
            applied += _apply(accepted.host, event)
            remember(accepted)
        else:
            by_job.setdefault(job_id, []).append((accepted, event))
    for job_id in sorted(by_job):  # one lock at a time, in a fixed order
        group = by_job[job_id]
        try:
            applied += _apply_job(job_id, group)
        except TRANSIENT:
            raise
        except Exception:
            log.exception("%s task events of job %s could not be applied", len(group), job_id)
            counters.incr(FAILED, len(group))
            continue
        auth.remember_all([accepted for accepted, _event in group])
    return applied


def _jobs_of(found: list[tuple[Accepted, TaskEvent]]) -> dict[tuple[int, int], int]:
    """(task id, host id) -> job id for the tasks the events name, in one query."""
    ids = {event.task_id for _accepted, event in found if _number(event.task_id)}
    rows = Task.objects.filter(pk__in=ids).values_list("pk", "host_id", "job_id") if ids else []
    return {(pk, host_id): job_id for pk, host_id, job_id in rows}


def _apply_job(job_id: int, group: list[tuple[Accepted, TaskEvent]]) -> int:
    """Apply one job's events in order, its row locked once. The group's tasks are read in one query, sharing one
    job instance: a STARTED or LISTENING changes only its own task's row and the job's (which the next event then sees
    on that instance), so the rows read stay true for the events after it. Any other event may end, fail or restart
    the gang (other tasks' rows written by query): every event after it reads its task afresh, as each did before
    (reading the rest of the group again after each exit of a 32-task gang read 528 rows for 32 events)."""
    applied = 0
    with transaction.atomic():
        _lock_job(job_id)
        tasks: dict[int, Task] | None = None
        for n, (accepted, event) in enumerate(group):
            if tasks is not None:
                task = tasks.get(event.task_id)
            elif event.kind in _OWN_ROWS_ONLY:
                tasks = _locked_group([later.task_id for _accepted, later in group[n:]])
                task = tasks.get(event.task_id)
            else:
                task = _locked(event.task_id)
            applied += _apply_to(task, accepted.host, event)
            if event.kind not in _OWN_ROWS_ONLY:
                tasks = None
    return applied


# Events whose handling writes no row but its task's and its job's (orchestrator/jobs/task_events.py apply_event).
_OWN_ROWS_ONLY = frozenset({TaskEventKind.STARTED, TaskEventKind.LISTENING})


def _apply(host: Host, event: TaskEvent) -> bool:
    with transaction.atomic():
        task = _lock_task(event.task_id, host) if _number(event.task_id) else None
        if task is None and isinstance(event.task_id, int) and foreign.placed_elsewhere(host, [event.task_id]):
            foreign.noted(host, f"a task event ({str(event.kind)[:20]})", [event.task_id])
            return False
        return _apply_to(task, host, event)


def _apply_to(task: Task | None, host: Host, event: TaskEvent) -> bool:
    if task is None or task.attempt != event.attempt:
        log.warning("task event for unknown task %s/%s from %s dropped", event.task_id, event.attempt, host.name)
        counters.incr(DROPPED)
        return False
    return apply_once(task, event)


def lines_missing(task: Task, lines: int | None) -> bool:
    """Whether an exit saying its task printed `lines` lines must wait: fewer of them are in (None: an agent that
    does not count them; its exit is applied at once)."""
    return isinstance(lines, int) and not isinstance(lines, bool) and lines > task.log_lines_in


def wait_for_lines(task: Task, event: TaskEvent) -> None:
    """Keep the exit on the task until its lines are in (the ingest applies it then, or a heartbeat after
    settings.TFDASH_EXIT_LINES_WAIT_S whatever is in)."""
    if task.exit_waiting is None:
        task.exit_waiting = {**asdict(event), "waiting_since": time.time()}
        save_fields(task, ["exit_waiting"])
        log.info("exit of task %s waits for its lines (%s printed, %s in)", task.pk, event.lines, task.log_lines_in)


def waited_enough(task: Task) -> bool:
    since = (task.exit_waiting or {}).get("waiting_since", 0)
    return not isinstance(since, int | float) or time.time() - since >= settings.TFDASH_EXIT_LINES_WAIT_S


def apply_waiting_exits(task_ids: list[int]) -> None:
    """The exits of these tasks that waited for their lines, applied now that all of them are in."""
    for task_id in task_ids:
        with transaction.atomic():
            job_id = Task.objects.filter(pk=task_id).values_list("job_id", flat=True).first()
            if job_id is None:
                continue
            _lock_job(job_id)
            task = Task.objects.select_for_update(of=("self",)).select_related("job", "host").get(pk=task_id)
            raw = task.exit_waiting
            if raw is None:
                continue
            event = TaskEvent(**{k: v for k, v in raw.items() if k in _EVENT_FIELDS})
            if lines_missing(task, event.lines):
                continue
            apply_waited(task, event)


def apply_waited(task: Task, event: TaskEvent) -> None:
    """Apply an exit that waited (job and task locked by the caller): the recorded exit is the truth."""
    task.exit_waiting = None
    task.event_seq = max(task.event_seq, _number(event.seq))
    save_fields(task, ["exit_waiting", "event_seq"])
    if task.state in ACTIVE_TASK_STATES:
        apply_event(task, event)


def apply_once(task: Task, event: TaskEvent) -> bool:
    """Apply an event to its task (job and task rows locked by the caller) unless it is a replay: not newer than the
    newest event applied to the task, or about a task already final. Returns whether it was applied.

    Every event says enough on its own (LISTENING and EXITED carry the pid too), so an older event overtaken by a
    newer one (two orchestrator workers, a redelivery) may be dropped without losing anything."""
    seq = _number(event.seq)
    if task.state not in ACTIVE_TASK_STATES or (seq and seq <= task.event_seq):
        log.info("replayed %s of task %s ignored", event.kind, task.pk)
        counters.incr(REPLAYED)
        return False
    if event.kind == TaskEventKind.EXITED and lines_missing(task, event.lines):
        # A final task has its whole log: the exit is applied once the lines it names are in.
        wait_for_lines(task, event)
        return False
    if seq:
        task.event_seq = seq
        if event.kind not in SAVES_EVENT_SEQ:
            save_fields(task, ["event_seq"])
    apply_event(task, event)
    return True


def _number(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63 else 0


def _lock_task(task_id: int, host: Host) -> Task | None:
    job_id = Task.objects.filter(pk=task_id, host=host).values_list("job_id", flat=True).first()
    if job_id is None:
        return None
    _lock_job(job_id)
    return _locked(task_id)


# Every event's rows are read by these two, so they are read lean: at fleet size the orchestrator's time goes to task
# events, and half of an event's was Django compiling the task's query (bench/event_cost.py). The job's row is locked
# without being read (what the lifecycle needs of it comes with its task), and neither asks for an order (.first() and
# the models' Meta.ordering add an ORDER BY to a query by pk).


def _lock_job(job_id: int) -> None:
    _JOB_LOCKED([job_id])


# Compiled once (orchestrator/plumbing/compiled_reads.py), as the tasks' read below: every event's transaction takes
# this lock.
_JOB_LOCKED = CompiledRead(lambda ids: Job.objects.select_for_update().filter(pk__in=ids).order_by().only("pk"))


def _locked(task_id: int) -> Task | None:
    """The task, its row locked (its job's already is), read with its job and host."""
    return _locked_group([task_id]).get(task_id)


# Compiled once per count of ids (orchestrator/plumbing/compiled_reads.py): every event reads its tasks by it, and
# compiling its 100-odd columns was more of an exit's CPU than running it (bench/event_cost.py).
_TASKS_LOCKED = CompiledRead(lambda ids: tasks_locked(Task.objects.select_related("job", "host").filter(pk__in=ids)))


def _locked_group(task_ids: list[int]) -> dict[int, Task]:
    """These tasks of one job (its row already locked), their rows locked, read with the job in one instance that
    they all share (what one event's handling changes of the job, the next one's reads) and their hosts."""
    ids = sorted({task_id for task_id in task_ids if _number(task_id)})
    tasks = {task.pk: task for task in _TASKS_LOCKED(ids)}
    shared = next(iter(tasks.values())).job if tasks else None
    for task in tasks.values():
        task.job = shared
    return tasks
