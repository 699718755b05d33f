"""A job's way from `starting` to its end, driven by what agents report about each task.

Every handler locks the job row first, then its tasks, so concurrent events of one job apply one at a time and in a
consistent order. Orders to agents and scheduler passes go out only after the transaction commits.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from orchestrator import agents, counters, dispatch
from orchestrator.models import (
    ACTIVE_TASK_STATES,
    TERMINAL_JOB_STATES,
    Host,
    HostPortBlock,
    Job,
    JobState,
    Strategy,
    Task,
    TaskLogLine,
    TaskState,
    TaskType,
)
from worker_agent.protocol import TaskEvent, TaskEventKind, TaskLogBatch

log = logging.getLogger(__name__)

DROPPED = "task_messages_dropped"
PORT_BLOCK_FOR = timedelta(minutes=10)
# After the chief (or worker 0) succeeded, other workers may still be finishing their last step or writing their
# temporary checkpoints (TF_NOTES: up to ~30 s): they get this long to exit by themselves before they are killed.
FINISH_GRACE = timedelta(seconds=60)
MAX_LINES_PER_BATCH = 2000
MAX_LINE_CHARS = 10_000


def schedule_later(cluster_id: int) -> None:
    from orchestrator.tasks import schedule

    transaction.on_commit(lambda: schedule.delay(cluster_id))


def kill_later(tasks: list[Task], reason: str) -> None:
    if tasks:
        transaction.on_commit(lambda: dispatch.kill_tasks(tasks, reason))


# --- agent messages ------------------------------------------------------------------------------------------------
def handle_task_event(payload: Any) -> bool:
    found = agents.authenticated_body(payload, TaskEvent)
    if found is None:
        return False
    host, event = found
    with transaction.atomic():
        task = _lock_task(event.task_id, host)
        if task is None or task.attempt != event.attempt:
            log.warning("task event for unknown task %s/%s from %s dropped", event.task_id, event.attempt, host.name)
            counters.incr(DROPPED)
            return False
        apply_event(task, event)
    return True


def handle_task_logs(payload: Any) -> int:
    found = agents.authenticated_body(payload, TaskLogBatch)
    if found is None:
        return 0
    host, batch = found
    try:
        lines = [(int(seq), str(stream)[:6], str(text)[:MAX_LINE_CHARS]) for seq, stream, text in batch.lines]
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("malformed log batch from %s: %r", host.name, exc)
        counters.incr(DROPPED)
        return 0
    task = Task.objects.filter(pk=batch.task_id, attempt=batch.attempt, host=host).first()
    if task is None:
        counters.incr(DROPPED)
        return 0
    rows = [TaskLogLine(task=task, seq=seq, stream=stream, text=text) for seq, stream, text in lines]
    # Redelivered batches carry the same (task, seq): stored once.
    TaskLogLine.objects.bulk_create(rows[:MAX_LINES_PER_BATCH], ignore_conflicts=True)
    return len(rows)


def _lock_task(task_id: int, host: Host) -> Task | None:
    job_id = Task.objects.filter(pk=task_id, host=host).values_list("job_id", flat=True).first()
    if job_id is None:
        return None
    Job.objects.select_for_update().filter(pk=job_id).first()
    return Task.objects.select_for_update(of=("self",)).select_related("job", "host").get(pk=task_id)


# --- the state machine ---------------------------------------------------------------------------------------------
def apply_event(task: Task, event: TaskEvent) -> None:
    job = task.job
    now = timezone.now()
    if event.kind == TaskEventKind.STARTED:
        task.pid = event.pid
        task.started_at = now
        if task.state == TaskState.STOPPING or job.is_terminal:
            # A kill overtook the launch on the agent: the process started after all, so stop it now.
            task.state = TaskState.STOPPING
            kill_later([task], "job already ended")
        elif task.state == TaskState.PENDING:
            # A single mirrored process opens no TF server: started is as connected as it gets.
            task.state = TaskState.RUNNING if task.port is None else TaskState.STARTING
        task.save(update_fields=["pid", "started_at", "state"])
        _maybe_running(job)
    elif event.kind == TaskEventKind.LISTENING:
        if task.state in (TaskState.PENDING, TaskState.STARTING):
            task.state = TaskState.RUNNING
        task.listening_at = now
        task.save(update_fields=["state", "listening_at"])
        _maybe_running(job)
    elif event.kind == TaskEventKind.EXITED:
        _exited(task, event.exit_code, event.detail, now)
    elif event.kind == TaskEventKind.PORT_CONFLICT:
        _port_conflict(task, event.detail, now)
    elif event.kind == TaskEventKind.LAUNCH_FAILED:
        if task.pid is not None:
            # A redelivered launch order refused because the task already runs: nothing is wrong with it.
            log.info("agent refused a duplicate launch of %s: %s", task, event.detail)
            return
        _finish_task(task, TaskState.FAILED, None, event.detail, now)
        if not job.is_terminal and task.attempt == job.attempt:
            _end_job(job, JobState.FAILED, f"{task.label} could not start: {event.detail}", failed=task)
    else:
        log.warning("unknown task event kind %r", event.kind)


def _maybe_running(job: Job) -> None:
    if job.state != JobState.STARTING:
        return
    states = set(job.current_tasks().values_list("state", flat=True))
    if states == {TaskState.RUNNING}:
        job.state, job.started_at = JobState.RUNNING, timezone.now()
        job.save(update_fields=["state", "started_at"])
        log.info("job %s running", job.pk)


def success_task(job: Job) -> tuple[str, int]:
    """TF's rule: the chief decides; without one (MultiWorkerMirrored, Mirrored), worker 0 does."""
    return (TaskType.CHIEF, 0) if job.strategy == Strategy.PARAMETER_SERVER else (TaskType.WORKER, 0)


def _exited(task: Task, code: int | None, detail: str, now: Any) -> None:
    job = task.job
    was_stopping = task.state == TaskState.STOPPING
    if code == 0:
        state = TaskState.SUCCEEDED
    else:
        state = TaskState.KILLED if was_stopping else TaskState.FAILED
    _finish_task(task, state, code, detail, now)
    if not job.is_terminal and task.attempt == job.attempt and not was_stopping:
        if code == 0 and (task.type, task.index) == success_task(job):
            _end_job(job, JobState.SUCCEEDED, f"{task.label} exited 0")
        elif code != 0:
            reason = f"{task.label} exited with code {code}"
            if code is not None and code < 0:
                reason = f"{task.label} was killed by signal {-code}"
            _end_job(job, JobState.FAILED, reason, failed=task)
    # Its port and devices are free now: a queued job may fit.
    schedule_later(job.cluster_id)


def _finish_task(task: Task, state: str, code: int | None, detail: str, now: Any) -> None:
    task.state, task.exit_code, task.finished_at = state, code, now
    if detail:
        task.detail = detail[:2000]
    task.save(update_fields=["state", "exit_code", "finished_at", "detail"])


def _port_conflict(task: Task, detail: str, now: Any) -> None:
    job = task.job
    HostPortBlock.objects.update_or_create(
        host=task.host, port=task.port, defaults={"until": now + PORT_BLOCK_FOR, "detail": detail[:500]}
    )
    _finish_task(task, TaskState.FAILED, None, f"port {task.port} was taken: {detail}", now)
    log.warning("job %s: port %s on %s is taken (%s); placing again", job.pk, task.port, task.host, detail)
    if job.is_terminal or task.attempt != job.attempt or job.state == JobState.QUEUED:
        return
    # Every task's TF_CONFIG names every port, so the whole gang is placed again, not just this task.
    _stop_tasks(job, "port conflict: placing the job again")
    job.state = JobState.QUEUED
    job.reason = f"port {task.port} on {task.host.name} was taken by another process; placing again"
    job.save(update_fields=["state", "reason"])
    schedule_later(job.cluster_id)


def _stop_tasks(job: Job, reason: str, *, types: tuple[str, ...] | None = None) -> list[Task]:
    active_tasks = job.tasks.filter(state__in=ACTIVE_TASK_STATES).exclude(state=TaskState.STOPPING)
    if types is not None:
        active_tasks = active_tasks.filter(type__in=types)
    active = list(active_tasks.select_related("host"))
    Task.objects.filter(pk__in=[t.pk for t in active]).update(state=TaskState.STOPPING)
    kill_later(active, reason)
    return active


def _end_job(job: Job, state: str, reason: str, failed: Task | None = None) -> None:
    job.state, job.reason, job.finished_at = state, reason, timezone.now()
    job.failed_task = failed
    job.save(update_fields=["state", "reason", "finished_at", "failed_task"])
    log.info("job %s %s: %s", job.pk, state, reason)
    if state == JobState.SUCCEEDED and job.strategy != Strategy.PARAMETER_SERVER:
        # MultiWorkerMirrored workers end by themselves once the last step is done: they get FINISH_GRACE
        # (reap_finished_jobs) to finish writing.
        pass
    elif state == JobState.SUCCEEDED:
        # ParameterServer workers and ps only serve (`Server.join()`): they never exit by themselves.
        _stop_tasks(job, "the coordinator finished")
    else:
        # The rest of a failed gang would wait forever for its peer.
        _stop_tasks(job, f"job {state}")
    if not job.tasks.filter(state__in=ACTIVE_TASK_STATES).exists():
        schedule_later(job.cluster_id)


# --- user and watchdog actions -------------------------------------------------------------------------------------
def cancel(job_id: int, by: str) -> bool:
    """Cancel a job in any non-final state; its processes are killed. Returns False when it had already ended."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.is_terminal:
            return False
        _end_job(job, JobState.CANCELLED, f"cancelled by {by}")
    return True


def check_startup_deadlines() -> list[int]:
    """Fail jobs whose tasks were not all running and connected within their deadline (TF itself waits forever)."""
    failed = []
    now = timezone.now()
    for job_id, placed_at, deadline in Job.objects.filter(state=JobState.STARTING).values_list(
        "pk", "placed_at", "startup_deadline_s"
    ):
        if placed_at is None or placed_at + timedelta(seconds=deadline) > now:
            continue
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            if job.state != JobState.STARTING:
                continue
            waiting = [t for t in job.current_tasks() if t.state != TaskState.RUNNING]
            details = "; ".join(f"{t.label} is {_waiting_for(t)}" for t in waiting)
            _end_job(
                job,
                JobState.FAILED,
                f"not all tasks running and connected within {job.startup_deadline_s} s: {details}",
                failed=waiting[0] if waiting else None,
            )
            failed.append(job_id)
    return failed


def host_lost(host_id: int, host_name: str) -> list[int]:
    """The host went silent: its running tasks are `lost`, and each job that had one fails with that reason
    (restarting from checkpoint is the restart policy's business). Returns the ids of the jobs it failed."""
    failed = []
    job_ids = set(Task.objects.filter(host_id=host_id, state__in=ACTIVE_TASK_STATES).values_list("job_id", flat=True))
    for job_id in sorted(job_ids):
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            lost = list(job.tasks.select_for_update().filter(host_id=host_id, state__in=ACTIVE_TASK_STATES))
            now = timezone.now()
            for task in lost:
                _finish_task(task, TaskState.LOST, None, f"host {host_name} stopped answering", now)
            current = [t for t in lost if t.attempt == job.attempt]
            if current and not job.is_terminal:
                names = ", ".join(f"{t.type} {t.index}" for t in current)
                _end_job(job, JobState.FAILED, f"host {host_name} went offline; lost {names}", failed=current[0])
                failed.append(job_id)
            schedule_later(job.cluster_id)
    return failed


def reap_finished_jobs() -> int:
    """Kill what still runs of jobs that ended more than FINISH_GRACE ago; returns how many tasks were stopped."""
    cutoff = timezone.now() - FINISH_GRACE
    stopped = 0
    job_ids = set(
        Task.objects.filter(
            state__in=(TaskState.PENDING, TaskState.STARTING, TaskState.RUNNING),
            job__state__in=TERMINAL_JOB_STATES,
            job__finished_at__lt=cutoff,
        ).values_list("job_id", flat=True)
    )
    for job_id in job_ids:
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            stopped += len(_stop_tasks(job, f"still running {FINISH_GRACE.seconds} s after the job {job.state}"))
    return stopped


def _waiting_for(task: Task) -> str:
    if task.state == TaskState.PENDING:
        return "not started (the agent never confirmed the launch)"
    if task.state == TaskState.STARTING:
        return f"started but not listening on port {task.port}"
    return task.state
