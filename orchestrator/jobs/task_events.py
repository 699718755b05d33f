"""What an agent reports about a task, applied to the task and its job (`apply_event`; orchestrator/agents/events.py
hands them in): started, listening (the gang is running once all are), exited (success by the job's success rule, or a
failure for orchestrator/jobs/restarts.py), launch failed, and a port found taken (the port is blocked a while and the
gang placed again). The caller holds the job's and the task's row locks."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from contracts.strategies import speaks_for_job
from contracts.task_messages import TaskEvent, TaskEventKind
from orchestrator.core import restarts
from orchestrator.jobs.lifecycle import (
    STOPPED_TO_REQUEUE,
    end_job,
    finish_task,
    is_live_task,
    kill_later,
    schedule_later,
    stop_tasks,
    succeed,
)
from orchestrator.jobs.restarts import task_failed
from orchestrator.models import (
    HostPortBlock,
    Job,
    JobState,
    Task,
    TaskState,
)
from orchestrator.plumbing.compiled_reads import CompiledRead
from orchestrator.plumbing.compiled_writes import save_fields

log = logging.getLogger(__name__)


PORT_BLOCK_FOR = timedelta(minutes=10)


# Events whose handling always saves the task's row: the event number the caller set on it (agents/events.py
# apply_once) rides in that UPDATE instead of one of its own. (finish_task saves it too: every caller holds the
# task's row lock, so the number it writes is the newest.)
SAVES_EVENT_SEQ = frozenset(
    {TaskEventKind.STARTED, TaskEventKind.LISTENING, TaskEventKind.EXITED, TaskEventKind.PORT_CONFLICT}
)


def reported_start(task: Task, event: TaskEvent, now: datetime) -> datetime:
    """When the task's process started: the agent's clock when it launched it (`event.at`), not when the event was
    applied, which a backlog or an outage of the control plane delays by as long as it lasts. Bounded by the control
    plane's own clock, so an agent's clock that is off cannot move it out of what is known: not before the task was
    placed (a clock behind), not after now (a clock ahead, or a time that is no time)."""
    try:
        at = datetime.fromtimestamp(event.at, tz=UTC)
    except (OverflowError, OSError, ValueError, TypeError):
        return now
    if task.placed_at is not None:
        at = max(at, task.placed_at)
    return min(at, now)


def apply_event(task: Task, event: TaskEvent) -> None:
    job = task.job
    now = timezone.now()
    if event.kind == TaskEventKind.STARTED:
        task.pid = event.pid
        task.started_at = reported_start(task, event, now)
        if task.state == TaskState.STOPPING or job.is_terminal:
            # A kill overtook the launch on the agent: the process started after all, so stop it now.
            task.state = TaskState.STOPPING
            kill_later([task], "job already ended")
        elif task.state == TaskState.PENDING:
            # A single mirrored process opens no TF server: started is as connected as it gets.
            task.state = TaskState.RUNNING if task.port is None else TaskState.STARTING
        save_fields(task, ["pid", "started_at", "state", "event_seq"])
        _maybe_running(job, task)
    elif event.kind == TaskEventKind.LISTENING:
        if task.state in (TaskState.PENDING, TaskState.STARTING):
            task.state = TaskState.RUNNING
        task.listening_at = now
        # STARTED may have been overtaken (and is then dropped as older): this event says as much.
        task.pid = task.pid or event.pid
        task.started_at = task.started_at or reported_start(task, event, now)
        save_fields(task, ["state", "listening_at", "pid", "started_at", "event_seq"])
        _maybe_running(job, task)
    elif event.kind == TaskEventKind.EXITED:
        _exited(task, event.exit_code, event.detail, now)
    elif event.kind == TaskEventKind.PORT_CONFLICT:
        _port_conflict(task, event.detail, now)
    elif event.kind == TaskEventKind.LAUNCH_FAILED:
        if task.pid is not None:
            # A redelivered launch order refused because the task already runs: nothing is wrong with it.
            log.info("agent refused a duplicate launch of %s: %s", task, event.detail)
            return
        finish_task(task, TaskState.FAILED, None, event.detail, now)
        if is_live_task(job, task):
            end_job(job, JobState.FAILED, f"{task.label} could not start: {event.detail}", failed=task)
    else:
        log.warning("unknown task event kind %r", event.kind)


# The states of the job's current tasks, asked by every event that makes its task RUNNING: compiled once
# (orchestrator/plumbing/compiled_reads.py). No order: Task's Meta.ordering sorts by its job's, which joins the job
# table.
_CURRENT_STATES = CompiledRead(
    lambda job_and_attempt: (
        # (Two filters: one filter's keywords are sorted, and the values must be the query's parameters in order.)
        Task.objects.filter(job_id=job_and_attempt[0]).filter(attempt=job_and_attempt[1]).order_by().only("state")
    )
)


def _maybe_running(job: Job, task: Task) -> None:
    # Only the event that made its own task RUNNING can make the last of the gang so: a task still STARTING
    # (started, its server not listening yet) asks nothing of the others' rows (a query per STARTED of a gang).
    if job.state != JobState.STARTING or task.state != TaskState.RUNNING:
        return
    states = {current.state for current in _CURRENT_STATES([job.pk, job.attempt])}
    if states == {TaskState.RUNNING}:
        now = timezone.now()
        job.state, job.progress_at, job.progress_mark = JobState.RUNNING, now, ""
        job.started_at = job.started_at or now  # a restarted job keeps its first start
        save_fields(job, ["state", "started_at", "progress_at", "progress_mark"])
        log.info("job %s running", job.pk)


def _exited(task: Task, code: int | None, detail: str, now: Any) -> None:
    job = task.job
    was_stopping = task.state == TaskState.STOPPING
    if code == 0:
        state = TaskState.SUCCEEDED
    else:
        state = TaskState.KILLED if was_stopping else TaskState.FAILED
    finish_task(task, state, code, detail, now)
    if code == 0 and _completed_while_stopped(job, task):
        # Its run ended before the stop did (TF ignores SIGTERM; the grace or the stop order's way was long enough):
        # the work is done and its checkpoint already emptied, so placing it again would train from epoch 1.
        stop = "preemption" if job.state == JobState.PREEMPTED else "restart"
        succeed(job, f"{task.label} exited 0 (its run completed before the {stop}'s stop took effect)")
    elif is_live_task(job, task) and not was_stopping:
        if code == 0 and (task.type, task.index) == speaks_for_job(job.strategy):
            if job.ending != JobState.FAILED:  # a failure awaiting its peers' word is not undone by an exit 0
                succeed(job, f"{task.label} exited 0")
        elif code != 0:
            reason = f"{task.label} exited with code {code}"
            if code is not None and code < 0:
                reason = f"{task.label} was killed by signal {-code}"
            task_failed(task, reason, restarts.retryable(job.restart_policy, code))
    # Its port and devices are free now: a queued job may fit.
    schedule_later(job.cluster_id)


def _completed_while_stopped(job: Job, task: Task) -> bool:
    """Whether `task` is the one whose exit 0 decides its job (speaks_for_job) and it came while the job's current gang
    was being stopped to be placed again: then the run finished, and nothing is left to resume."""
    return (
        job.state in STOPPED_TO_REQUEUE
        and not job.ending
        and task.attempt == job.attempt
        and (task.type, task.index) == speaks_for_job(job.strategy)
    )


def _port_conflict(task: Task, detail: str, now: Any) -> None:
    job = task.job
    HostPortBlock.objects.update_or_create(
        host=task.host, port=task.port, defaults={"until": now + PORT_BLOCK_FOR, "detail": detail[:500]}
    )
    finish_task(task, TaskState.FAILED, None, f"port {task.port} was taken: {detail}", now)
    log.warning("job %s: port %s on %s is taken (%s); placing again", job.pk, task.port, task.host, detail)
    if job.is_terminal or task.attempt != job.attempt or job.state == JobState.QUEUED:
        return
    # Every task's TF_CONFIG names every port, so the whole gang is placed again, not just this task.
    stop_tasks(job, "port conflict: placing the job again")
    job.state = JobState.QUEUED
    job.reason = f"port {task.port} on {task.host.name} was taken by another process; placing again"
    save_fields(job, ["state", "reason"])
    schedule_later(job.cluster_id)
