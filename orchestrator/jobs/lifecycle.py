"""A job's way from `starting` to its end, driven by what agents report about each task (orchestrator/agents/events.py
hands them in) and by the watchdog.

Every handler locks the job row first, then its tasks, so concurrent events of one job apply one at a time and in a
consistent order. Orders to agents and scheduler passes go out only after the transaction commits.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from contracts.strategies import speaks_for_job
from contracts.task_messages import TaskEvent, TaskEventKind
from orchestrator.core import restarts
from orchestrator.jobs import dispatch
from orchestrator.metrics import live
from orchestrator.models import (
    ACTIVE_TASK_STATES,
    TERMINAL_JOB_STATES,
    HostPortBlock,
    Job,
    JobEvent,
    JobState,
    MetricPoint,
    Strategy,
    Task,
    TaskLogLine,
    TaskState,
    TaskType,
)
from orchestrator.models.row_locks import lock_rows, tasks_locked
from orchestrator.plumbing import pass_requests as passes
from orchestrator.plumbing.compiled_reads import CompiledRead
from orchestrator.plumbing.compiled_writes import save_fields

log = logging.getLogger(__name__)

PORT_BLOCK_FOR = timedelta(minutes=10)
# After the chief (or worker 0) succeeded, other workers may still be finishing their last step or writing their
# temporary checkpoints (TF_NOTES: up to ~30 s): they get this long to exit by themselves before they are killed.
FINISH_GRACE = timedelta(seconds=60)


def peer_word_wait() -> timedelta:
    """How long a gang's permanent failure waits for word of its peers' hosts before the job fails (task_failed).

    A lost host makes its peers fail too, and first: a MultiWorkerMirrored survivor exits 1 with `UnavailableError`
    within seconds (TF_NOTES; measured here 1.6 s after its chief's host went), long before the host's heartbeats are
    missed for a whole timeout. Two timeouts leave the watchdog its pauses (orchestrator/agents/liveness.py)."""
    return timedelta(seconds=2 * settings.TFDASH_HEARTBEAT_TIMEOUT_S)


def schedule_later(cluster_id: int) -> None:
    passes.schedule_after_commit(cluster_id)


def kill_later(tasks: list[Task], reason: str) -> None:
    if tasks:
        transaction.on_commit(lambda: dispatch.kill_tasks(tasks, reason))


# --- the state machine ---------------------------------------------------------------------------------------------
# Events whose handling always saves the task's row: the event number the caller set on it (agents/events.py
# apply_once) rides in that UPDATE instead of one of its own. (_finish_task saves it too: every caller holds the
# task's row lock, so the number it writes is the newest.)
SAVES_EVENT_SEQ = frozenset(
    {TaskEventKind.STARTED, TaskEventKind.LISTENING, TaskEventKind.EXITED, TaskEventKind.PORT_CONFLICT}
)


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
        save_fields(task, ["pid", "started_at", "state", "event_seq"])
        _maybe_running(job, task)
    elif event.kind == TaskEventKind.LISTENING:
        if task.state in (TaskState.PENDING, TaskState.STARTING):
            task.state = TaskState.RUNNING
        task.listening_at = now
        # STARTED may have been overtaken (and is then dropped as older): this event says as much.
        task.pid = task.pid or event.pid
        task.started_at = task.started_at or now
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
        _finish_task(task, TaskState.FAILED, None, event.detail, now)
        if _is_live_task(job, task):
            _end_job(job, JobState.FAILED, f"{task.label} could not start: {event.detail}", failed=task)
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
    _finish_task(task, state, code, detail, now)
    if code == 0 and _completed_while_stopped(job, task):
        # Its run ended before the stop did (TF ignores SIGTERM; the grace or the stop order's way was long enough):
        # the work is done and its checkpoint already emptied, so placing it again would train from epoch 1.
        stop = "preemption" if job.state == JobState.PREEMPTED else "restart"
        _succeed(job, f"{task.label} exited 0 (its run completed before the {stop}'s stop took effect)")
    elif _is_live_task(job, task) and not was_stopping:
        if code == 0 and (task.type, task.index) == speaks_for_job(job.strategy):
            if job.ending != JobState.FAILED:  # a failure awaiting its peers' word is not undone by an exit 0
                _succeed(job, f"{task.label} exited 0")
        elif code != 0:
            reason = f"{task.label} exited with code {code}"
            if code is not None and code < 0:
                reason = f"{task.label} was killed by signal {-code}"
            task_failed(task, reason, restarts.retryable(job.restart_policy, code))
    # Its port and devices are free now: a queued job may fit.
    schedule_later(job.cluster_id)


def _is_live_task(job: Job, task: Task) -> bool:
    """Whether what happens to `task` still matters to the job: its attempt is the job's and the job goes on (its
    success rule has not decided it)."""
    return (
        not job.is_terminal
        and job.ending in ("", JobState.FAILED)  # a failure awaiting its peers' word may still become a restart
        and job.state not in STOPPED_TO_REQUEUE
        and task.attempt == job.attempt
    )


# States whose gang is being stopped on purpose, to be placed again: its tasks' ends say nothing about the job.
STOPPED_TO_REQUEUE = (JobState.RESTARTING, JobState.PREEMPTED)


def _completed_while_stopped(job: Job, task: Task) -> bool:
    """Whether `task` is the one whose exit 0 decides its job (speaks_for_job) and it came while the job's current gang
    was being stopped to be placed again: then the run finished, and nothing is left to resume."""
    return (
        job.state in STOPPED_TO_REQUEUE
        and not job.ending
        and task.attempt == job.attempt
        and (task.type, task.index) == speaks_for_job(job.strategy)
    )


# --- ending: a final job has no live task --------------------------------------------------------------------------
# Asked at every exit of a gang whose end is decided (once per task): compiled once
# (orchestrator/plumbing/compiled_reads.py).
_AN_ACTIVE_TASK = CompiledRead(
    lambda job_ids: Task.objects.filter(job_id__in=job_ids, state__in=ACTIVE_TASK_STATES).order_by().only("pk")[:1]
)


def _has_active_tasks(job: Job) -> bool:
    return bool(_AN_ACTIVE_TASK([job.pk]))


WAITING_FOR_OTHERS = "; waiting for the job's other tasks to end"


AWAITING_PEERS = "; failing unless a peer's host proves lost within "


def _awaiting_peers(wait: timedelta) -> str:
    return f"{AWAITING_PEERS}{wait.seconds} s (a lost host makes its peers fail)"


def _succeed(job: Job, reason: str) -> None:
    """The job's success rule decided it: it is `succeeded` once every task of it has ended. MultiWorkerMirrored
    workers end by themselves (they get FINISH_GRACE, reap_finished_jobs); ParameterServer workers and ps only
    serve (`Server.join()`) and never do, so they are stopped now. Either way a task stopped so ends `killed`, its
    detail naming the success rule."""
    if not _has_active_tasks(job):
        _end_job(job, JobState.SUCCEEDED, reason)
        return
    job.ending, job.ending_at, job.reason = JobState.SUCCEEDED, timezone.now(), reason + WAITING_FOR_OTHERS
    save_fields(job, ["ending", "ending_at", "reason"])
    log.info("job %s %s: waiting for its other tasks", job.pk, reason)
    if job.strategy == Strategy.PARAMETER_SERVER:
        _stop_tasks(job, f"stopped by the job's success rule ({reason})")


def _maybe_final(job: Job) -> None:
    """A task of the job ended: the job takes the state its success rule decided once it was the last."""
    if job.ending and not job.is_terminal and not _has_active_tasks(job):
        failed = job.failed_task if job.ending == JobState.FAILED else None
        _end_job(job, job.ending, _without_suffix(job.reason), failed=failed)


def _without_suffix(reason: str) -> str:
    """The decided reason, without what it was waiting for."""
    return reason.removesuffix(WAITING_FOR_OTHERS).split(AWAITING_PEERS)[0]


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
    if job.ending == JobState.FAILED and not allowed:
        return  # the gang already fails, awaiting its peers' word: this adds nothing a restart could change
    if _is_ps_worker(job, task):
        if allowed and not host_gone:
            _relaunch_in_place(job, task, reason)
        else:
            why = "its host is gone" if host_gone else _why_no_restart(job, retryable)
            job.reason = f"{reason}; training goes on without it ({why})"
            save_fields(job, ["reason"])
        return
    if allowed:
        restart_job(job, reason, failed=task)
        return
    if retryable and job.max_restarts:
        reason = f"{reason} ({_why_no_restart(job, retryable)})"
    if _peers_still_running(job, task):
        # A peer's host may be what failed this task (a lost chief fails its workers first): the verdict waits for
        # the host to be judged. Its loss restarts the job (lose_tasks); else the job fails as it would have.
        wait = peer_word_wait()
        job.ending, job.ending_at, job.failed_task = JobState.FAILED, timezone.now(), task
        job.reason = reason + _awaiting_peers(wait)
        save_fields(job, ["ending", "ending_at", "failed_task", "reason"])
        log.info("job %s: %s; awaiting its peers' word for %s s", job.pk, reason, wait.seconds)
        return
    _end_job(job, JobState.FAILED, reason, failed=task)


def _peers_still_running(job: Job, task: Task) -> bool:
    """Whether other tasks of the gang still run on other hosts (whose loss could explain this failure)."""
    if job.restarts >= job.max_restarts or not restarts.retryable(job.restart_policy, None, lost=True):
        return False  # a lost host could not restart the job either: nothing to wait for
    return (
        job.tasks.filter(attempt=job.attempt, state__in=ACTIVE_TASK_STATES)
        .exclude(state=TaskState.STOPPING)
        .exclude(host_id=task.host_id)
        .exists()
    )


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
    job.ending, job.ending_at = "", None  # a failure that awaited its peers' word is this restart now
    save_fields(job, ["restarts", "state", "failed_task", "restart_reason", "reason", "ending", "ending_at"])
    log.warning("job %s restarting: %s", job.pk, reason)
    _stop_tasks(job, f"restarting the job: {reason}")
    schedule_later(job.cluster_id)


def _relaunch_in_place(job: Job, task: Task, reason: str) -> None:
    """A new row for the same slot (type, index, host, port, TF_CONFIG), launched at once."""
    job.restarts += 1
    job.restart_reason = reason
    job.reason = f"{reason}; relaunched in place (restart {job.restarts} of {job.max_restarts})"
    save_fields(job, ["restarts", "restart_reason", "reason"])
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
    save_fields(task, ["state", "exit_code", "finished_at", "detail", "event_seq"])
    _maybe_final(task.job)


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
    save_fields(job, ["state", "reason"])
    schedule_later(job.cluster_id)


def _stop_tasks(job: Job, reason: str, *, types: tuple[str, ...] | None = None) -> list[Task]:
    active_tasks = job.tasks.filter(state__in=ACTIVE_TASK_STATES).exclude(state=TaskState.STOPPING)
    if types is not None:
        active_tasks = active_tasks.filter(type__in=types)
    active = list(tasks_locked(active_tasks.select_related("host")))  # the job's row is locked: row_locks.py
    Task.objects.filter(pk__in=[t.pk for t in active]).update(state=TaskState.STOPPING)
    if active:
        live.job_changed(job.pk)
    kill_later(active, reason)
    return active


def _end_job(job: Job, state: str, reason: str, failed: Task | None = None) -> None:
    job.state, job.reason, job.finished_at = state, reason, timezone.now()
    job.failed_task = failed
    job.ending = ""
    save_fields(job, ["state", "reason", "finished_at", "failed_task", "ending"])
    log.info("job %s %s: %s", job.pk, state, reason)
    if state == JobState.SUCCEEDED:
        pass  # every task has ended (_succeed)
    else:
        # The rest of a failed gang would wait forever for its peer.
        _stop_tasks(job, f"job {state}")
    if not _has_active_tasks(job):
        schedule_later(job.cluster_id)


# --- preemption and time limits ------------------------------------------------------------------------------------
def last_epoch(job: Job) -> int:
    """The last epoch the job completed (epochs count from 1; 0: none yet): its checkpoint is that epoch's end."""
    done = MetricPoint.objects.filter(job=job, phase="epoch_end").aggregate(last=Max("epoch"))["last"]
    return int(done or 0)


def preempt(job_id: int, *, by: int, why: str) -> bool:
    """Stop a running job's gang for job #`by` and queue it again with its place kept (its `created_at`); it resumes
    from its last checkpoint. Not a failure: no restart is used. False when it was no longer running."""
    job = Job.objects.select_for_update().get(pk=job_id)
    if job.state not in (JobState.STARTING, JobState.RUNNING) or job.ending:
        return False  # (a job whose success rule decided it only waits for its last tasks to end)
    # The epoch it is in when stopped (its last checkpoint is the one before, or this one's end if it finishes it
    # within the grace); "resumed at epoch ..." says where it went on from.
    at = f"in epoch {last_epoch(job) + 1}"
    job.state, job.preemptions = JobState.PREEMPTED, job.preemptions + 1
    job.reason = (
        f"preempted by #{by} ({why}) {at}; back in the queue with its place kept, to resume from its checkpoint"
    )
    save_fields(job, ["state", "preemptions", "reason"])
    JobEvent.objects.create(job=job, kind="preempted", text=f"preempted by #{by} ({why}) {at}")
    log.warning("job %s preempted by job %s: %s", job.pk, by, why)
    _stop_tasks(job, f"preempted by job #{by}")
    schedule_later(job.cluster_id)
    return True


def resumed(jobs: list[Job], hosts_of: dict[int, list[str]]) -> None:
    """Preempted jobs placed again: their story says where, and from which epoch they go on."""
    JobEvent.objects.bulk_create(
        JobEvent(
            job=job, kind="resumed", text=f"resumed at epoch {last_epoch(job) + 1} on {', '.join(hosts_of[job.pk])}"
        )
        for job in jobs
    )


def check_time_limits() -> list[int]:
    """End every job whose current run (from its placement) has reached its time limit: state timed out; its tasks
    get SIGTERM, the cluster's grace, then SIGKILL (the agent's kill). Returns the ids of the jobs timed out."""
    ended = []
    now = timezone.now()
    running = Job.objects.filter(state__in=(JobState.STARTING, JobState.RUNNING), placed_at__isnull=False, ending="")
    for job_id, placed_at, limit in running.values_list("pk", "placed_at", "time_limit_s"):
        if placed_at + timedelta(seconds=limit) > now:
            continue
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            if job.state not in (JobState.STARTING, JobState.RUNNING) or job.placed_at != placed_at or job.ending:
                continue
            epoch = last_epoch(job)
            _end_job(job, JobState.TIMED_OUT, f"time limit of {limit} s reached (after epoch {epoch})" if epoch
                     else f"time limit of {limit} s reached")  # fmt: skip
            JobEvent.objects.create(job=job, kind="timed_out", text=job.reason)
            ended.append(job_id)
    return ended


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
            lost = list(tasks_locked(job.tasks.filter(host_id=host_id, state__in=ACTIVE_TASK_STATES)))
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
        task.job = job  # the locked row: the last one's end may make the job final
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
    (numbers changing), never on the hosts' clocks. Returns the ids of the jobs found hung.

    Every watchdog tick asks this of every running job: their marks are read in one query and the moved ones stored
    in one statement (a query and an UPDATE per job, 300 running jobs, took the tick past a second)."""
    hung = []
    now = timezone.now()
    looks = _progress_looks()
    _store_marks([(job_id, look.stored, look.mark) for job_id, look in looks.items() if look.moved], now)
    for job_id, look in looks.items():
        if look.moved or now - look.since < timedelta(seconds=look.timeout_s):  # type: ignore[operator]
            continue
        with transaction.atomic():
            locked = Job.objects.select_for_update().get(pk=job_id)
            if locked.state != JobState.RUNNING or locked.progress_mark != look.mark:
                continue
            reason = f"no progress for {locked.progress_timeout_s} s (no metric point or log line)"
            if restarts.retryable(locked.restart_policy, None, hung=True) and locked.restarts < locked.max_restarts:
                restart_job(locked, reason)
            else:
                extra = f" ({_why_no_restart(locked, True)})" if locked.max_restarts else ""
                _end_job(locked, JobState.FAILED, reason + extra)
            hung.append(job_id)
    return hung


class _Look(NamedTuple):
    mark: str  # what the job has reported so far: its point number and its current tasks' log lines
    stored: str  # the mark the last look stored
    since: datetime | None  # when that mark was first seen
    timeout_s: int

    @property
    def moved(self) -> bool:
        return self.mark != self.stored or self.since is None


def _progress_looks() -> dict[int, _Look]:
    """Each running job's progress mark now: its last point number (contracts/protocol.py POINT_SEQ) and, per task of
    its current attempt, how far its log's line numbers reach (the newest line's number, read from the end of the
    task's line index)."""
    sql = f"""
        SELECT j.id, j.points_seq, coalesce(sum(l.upto), 0), j.progress_mark, j.progress_at, j.progress_timeout_s
        FROM {Job._meta.db_table} j
        LEFT JOIN {Task._meta.db_table} t ON t.job_id = j.id AND t.attempt = j.attempt
        LEFT JOIN LATERAL (
            SELECT max(line.seq) + 1 AS upto FROM {TaskLogLine._meta.db_table} line WHERE line.task_id = t.id
        ) l ON true
        WHERE j.state = %s AND j.ending = '' AND j.progress_timeout_s > 0
        GROUP BY j.id
    """  # noqa: S608 - table names from the models, every value a parameter
    with connection.cursor() as cursor:
        cursor.execute(sql, [str(JobState.RUNNING)])
        return {
            job_id: _Look(f"{points or 0}:{lines}", stored, since, timeout)
            for job_id, points, lines, stored, since, timeout in cursor.fetchall()
        }


def _store_marks(moved: list[tuple[int, str, str]], now: datetime) -> None:
    """Store each (job, mark it had, mark now) in one statement; only over the mark this look read: a look that
    overlaps another (a slow watchdog tick and the next) must not start the clock again over what the other stored
    since."""
    if not moved:
        return
    sql = f"""
        UPDATE {Job._meta.db_table} j SET progress_mark = v.mark, progress_at = %s
        FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS v(id, stored, mark)
        WHERE j.id = v.id AND j.state = %s AND j.progress_mark = v.stored
    """  # noqa: S608 - a table name from the model, every value a parameter
    ids, stored, marks = zip(*moved, strict=True)
    # Their rows locked first, in id order (orchestrator/models/row_locks.py): the UPDATE alone takes them in the
    # order of its plan, and the ingest holds rows of these very jobs (running ones) while it takes the next.
    with transaction.atomic(), connection.cursor() as cursor:
        lock_rows(jobs=ids)
        cursor.execute(sql, [now, list(ids), list(stored), list(marks), str(JobState.RUNNING)])


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
    awaited = timezone.now() - peer_word_wait()
    for job_id in Job.objects.filter(ending=JobState.FAILED, ending_at__lt=awaited).values_list("pk", flat=True):
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            if job.ending == JobState.FAILED and not job.is_terminal:
                # No peer's host was lost: the failure was the program's own.
                stopped += job.tasks.filter(state__in=ACTIVE_TASK_STATES).exclude(state=TaskState.STOPPING).count()
                _end_job(job, JobState.FAILED, _without_suffix(job.reason), failed=job.failed_task)
    for job_id in Job.objects.filter(ending=JobState.SUCCEEDED, ending_at__lt=cutoff).values_list("pk", flat=True):
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            if job.ending and not job.is_terminal:
                reason = f"stopped by the job's success rule: still running {FINISH_GRACE.seconds} s after it"
                stopped += len(_stop_tasks(job, reason))
    return stopped


def _waiting_for(task: Task) -> str:
    if task.state == TaskState.PENDING:
        return "not started (the agent never confirmed the launch)"
    if task.state == TaskState.STARTING:
        return f"started but not listening on port {task.port}"
    return task.state
