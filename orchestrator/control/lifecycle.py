"""A job's way from `starting` to its end, driven by what agents report about each task (orchestrator/agents/events.py
hands them in) and by the watchdog.

Every handler locks the job row first, then its tasks, so concurrent events of one job apply one at a time and in a
consistent order. Orders to agents and scheduler passes go out only after the transaction commits.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from contracts.protocol import TaskEvent, TaskEventKind
from contracts.strategies import speaks_for_job
from orchestrator.control import dispatch, passes
from orchestrator.core import restarts
from orchestrator.metrics import live
from orchestrator.models import (
    ACTIVE_TASK_STATES,
    TERMINAL_JOB_STATES,
    HostPortBlock,
    Job,
    JobState,
    MetricPoint,
    Strategy,
    Task,
    TaskLogLine,
    TaskState,
    TaskType,
)

log = logging.getLogger(__name__)

PORT_BLOCK_FOR = timedelta(minutes=10)
# After the chief (or worker 0) succeeded, other workers may still be finishing their last step or writing their
# temporary checkpoints (TF_NOTES: up to ~30 s): they get this long to exit by themselves before they are killed.
FINISH_GRACE = timedelta(seconds=60)


def schedule_later(cluster_id: int) -> None:
    passes.schedule_after_commit(cluster_id)


def kill_later(tasks: list[Task], reason: str) -> None:
    if tasks:
        transaction.on_commit(lambda: dispatch.kill_tasks(tasks, reason))


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
        # STARTED may have been overtaken (and is then dropped as older): this event says as much.
        task.pid = task.pid or event.pid
        task.started_at = task.started_at or now
        task.save(update_fields=["state", "listening_at", "pid", "started_at"])
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
        if _is_live_task(job, task):
            _end_job(job, JobState.FAILED, f"{task.label} could not start: {event.detail}", failed=task)
    else:
        log.warning("unknown task event kind %r", event.kind)


def _maybe_running(job: Job) -> None:
    if job.state != JobState.STARTING:
        return
    states = set(job.current_tasks().values_list("state", flat=True))
    if states == {TaskState.RUNNING}:
        now = timezone.now()
        job.state, job.progress_at, job.progress_mark = JobState.RUNNING, now, ""
        job.started_at = job.started_at or now  # a restarted job keeps its first start
        job.save(update_fields=["state", "started_at", "progress_at", "progress_mark"])
        log.info("job %s running", job.pk)


def _exited(task: Task, code: int | None, detail: str, now: Any) -> None:
    job = task.job
    was_stopping = task.state == TaskState.STOPPING
    if code == 0:
        state = TaskState.SUCCEEDED
    else:
        state = TaskState.KILLED if was_stopping else TaskState.FAILED
    _finish_task(task, state, code, detail, now)
    if _is_live_task(job, task) and not was_stopping:
        if code == 0 and (task.type, task.index) == speaks_for_job(job.strategy):
            _end_job(job, JobState.SUCCEEDED, f"{task.label} exited 0")
        elif code != 0:
            reason = f"{task.label} exited with code {code}"
            if code is not None and code < 0:
                reason = f"{task.label} was killed by signal {-code}"
            task_failed(task, reason, restarts.retryable(job.restart_policy, code))
    # Its port and devices are free now: a queued job may fit.
    schedule_later(job.cluster_id)


def _is_live_task(job: Job, task: Task) -> bool:
    """Whether what happens to `task` still matters to the job: its attempt is the job's and the job goes on."""
    return not job.is_terminal and job.state != JobState.RESTARTING and task.attempt == job.attempt


# --- restarts ------------------------------------------------------------------------------------------------------
def task_failed(task: Task, reason: str, retryable: bool, *, host_gone: bool = False) -> None:
    """A live task failed (not by our own kill): restart what the job's policy allows, else end the job.

    ParameterServer workers are special (TF_NOTES): the coordinator survives a lost worker and takes it back when it
    returns on the same address, so a worker is relaunched in place and the job goes on; when it cannot be (no
    restarts left, a permanent failure, its host gone), the job still goes on without it. Every other task takes the
    whole gang down: it is stopped, placed again and resumes from the job's last checkpoint.
    """
    job = task.job
    allowed = retryable and job.restarts < job.max_restarts
    if _is_ps_worker(job, task):
        if allowed and not host_gone:
            _relaunch_in_place(job, task, reason)
        else:
            why = "its host is gone" if host_gone else _why_no_restart(job, retryable)
            job.reason = f"{reason}; training goes on without it ({why})"
            job.save(update_fields=["reason"])
        return
    if allowed:
        restart_job(job, reason, failed=task)
        return
    if retryable and job.max_restarts:
        reason = f"{reason} ({_why_no_restart(job, retryable)})"
    _end_job(job, JobState.FAILED, reason, failed=task)


def _is_ps_worker(job: Job, task: Task) -> bool:
    return job.strategy == Strategy.PARAMETER_SERVER and task.type == TaskType.WORKER


def _why_no_restart(job: Job, retryable: bool) -> str:
    if not retryable:
        return f"not retryable under the {job.restart_policy} restart policy"
    if job.max_restarts == 0:
        return "the job allows no restarts"
    return f"all {job.max_restarts} restarts used"


def restart_job(job: Job, reason: str, failed: Task | None = None) -> None:
    """Stop the gang and queue the job to be placed again (with the next attempt) once its processes are gone."""
    job.restarts += 1
    job.state, job.failed_task, job.restart_reason = JobState.RESTARTING, failed, reason
    job.reason = f"{reason}; restarting from the last checkpoint (restart {job.restarts} of {job.max_restarts})"
    job.save(update_fields=["restarts", "state", "failed_task", "restart_reason", "reason"])
    log.warning("job %s restarting: %s", job.pk, reason)
    _stop_tasks(job, f"restarting the job: {reason}")
    schedule_later(job.cluster_id)


def _relaunch_in_place(job: Job, task: Task, reason: str) -> None:
    """A new row for the same slot (type, index, host, port, TF_CONFIG), launched at once."""
    job.restarts += 1
    job.restart_reason = reason
    job.reason = f"{reason}; relaunched in place (restart {job.restarts} of {job.max_restarts})"
    job.save(update_fields=["restarts", "restart_reason", "reason"])
    again = Task.objects.create(
        job=job,
        attempt=task.attempt,
        type=task.type,
        index=task.index,
        restart=task.restart + 1,
        restarts=task.restarts + 1,
        host=task.host,
        port=task.port,
        devices=task.devices,
        tf_config=task.tf_config,
        ordered_at=timezone.now(),  # its launch goes out on commit
    )
    log.warning("job %s: %s; relaunching it in place", job.pk, reason)
    transaction.on_commit(lambda: dispatch.launch_tasks([again.pk]))


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
    if active:
        live.job_changed(job.pk)
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
    """The host went silent: its running tasks are `lost`, and each job that had a live one goes through its restart
    policy (a lost host is retryable by default). Returns the ids of the jobs that failed."""
    failed = []
    job_ids = set(Task.objects.filter(host_id=host_id, state__in=ACTIVE_TASK_STATES).values_list("job_id", flat=True))
    for job_id in sorted(job_ids):
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            lost = list(job.tasks.select_for_update().filter(host_id=host_id, state__in=ACTIVE_TASK_STATES))
            ended_before = job.is_terminal
            detail = f"host {host_name} stopped answering"
            lose_tasks(job, [(t, detail) for t in lost], f"host {host_name} went offline", host_gone=True)
            if not ended_before and job.state == JobState.FAILED:
                failed.append(job_id)
    return failed


def lose_tasks(
    job: Job, gone: list[tuple[Task, str]], reason: str, *, host_gone: bool, stopping_as: str = TaskState.LOST
) -> None:
    """Tasks whose processes are gone (the caller holds the job's and their locks), each with its detail: they end
    `lost` (a task we were stopping ends `stopping_as`), and a live one sends the job through its restart policy,
    the gang before a ParameterServer worker (whose job goes on without it)."""
    now = timezone.now()
    live = [t for t, _ in gone if _is_live_task(job, t) and t.state != TaskState.STOPPING]
    for task, detail in gone:
        _finish_task(task, stopping_as if task.state == TaskState.STOPPING else TaskState.LOST, None, detail, now)
    if live:
        first = ([t for t in live if not _is_ps_worker(job, t)] or live)[0]
        first.job = job  # the locked row
        retryable = restarts.retryable(job.restart_policy, None, lost=True)
        names = ", ".join(str(t) for t in live)
        task_failed(first, f"{reason}; lost {names}", retryable, host_gone=host_gone)
    # Their ports and devices are free now.
    schedule_later(job.cluster_id)


# --- hang detection ------------------------------------------------------------------------------------------------
def check_progress() -> list[int]:
    """Running jobs that reported nothing new (no metric point, no log line) for their `progress_timeout_s` are hung:
    restarted if their policy allows, else failed with the reason. Progress is judged on the orchestrator's clock
    (ids changing), never on the hosts' clocks. Returns the ids of the jobs found hung."""
    hung = []
    now = timezone.now()
    for job in Job.objects.filter(state=JobState.RUNNING, progress_timeout_s__gt=0):
        newest_point = MetricPoint.objects.filter(job=job).order_by("-id").values_list("id", flat=True).first()
        newest_line = (
            TaskLogLine.objects.filter(task__job=job, task__attempt=job.attempt)
            .order_by("-id")
            .values_list("id", flat=True)
            .first()
        )
        mark = f"{newest_point or 0}:{newest_line or 0}"
        if mark != job.progress_mark or job.progress_at is None:
            # Only over the mark this look read: a look that overlaps another (a slow watchdog tick and the next)
            # must not start the clock again over what the other stored since.
            Job.objects.filter(pk=job.pk, state=JobState.RUNNING, progress_mark=job.progress_mark).update(
                progress_mark=mark, progress_at=now
            )
            continue
        if now - job.progress_at < timedelta(seconds=job.progress_timeout_s):
            continue
        with transaction.atomic():
            locked = Job.objects.select_for_update().get(pk=job.pk)
            if locked.state != JobState.RUNNING or locked.progress_mark != mark:
                continue
            reason = f"no progress for {locked.progress_timeout_s} s (no metric point or log line)"
            if restarts.retryable(locked.restart_policy, None, hung=True) and locked.restarts < locked.max_restarts:
                restart_job(locked, reason)
            else:
                extra = f" ({_why_no_restart(locked, True)})" if locked.max_restarts else ""
                _end_job(locked, JobState.FAILED, reason + extra)
            hung.append(job.pk)
    return hung


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
