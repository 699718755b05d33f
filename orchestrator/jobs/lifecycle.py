"""A job's way from `starting` to its end: the steps every handler shares, and what others do to a running job.

The shared steps: a task ends (`finish_task`), a job ends (`end_job`) or waits, its end decided, for its other tasks to
end (`succeed`, the `ending` field), a gang is stopped (`stop_tasks`); orders to agents and scheduler passes go out only
after the transaction commits. The actions: a person cancels a job (`cancel`), the scheduler preempts one (`preempt`,
`resumed`). What drives the state machine is beside it in orchestrator/jobs/: task_events.py (what agents report),
restarts.py (a task's failure, a lost host), and the watchdog's checks: time_limits.py (time limits and startup
deadlines), hangs.py (no progress), reaping.py (what still runs of ended jobs).

Every handler locks the job row first, then its tasks, so concurrent events of one job apply one at a time and in a
consistent order.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from contracts.strategies import speaks_for_job
from orchestrator.core import preemption, preflight
from orchestrator.diagnosis.store import DIAGNOSED_STATES, diagnose_after_commit
from orchestrator.jobs import dispatch
from orchestrator.metrics import live
from orchestrator.models import (
    ACTIVE_TASK_STATES,
    Job,
    JobEvent,
    JobState,
    MetricPoint,
    Strategy,
    Task,
    TaskState,
)
from orchestrator.models.row_locks import tasks_locked
from orchestrator.plumbing import pass_requests as passes
from orchestrator.plumbing.compiled_reads import CompiledRead
from orchestrator.plumbing.compiled_writes import save_fields
from orchestrator.usage import recording as usage_recording

log = logging.getLogger(__name__)

# Said once a job reached its class's bound on preemptions (orchestrator/core/preemption.py).
SHIELDED = "preempted {times} times: protected from further preemption until it ends"


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


# States whose gang is being stopped on purpose, to be placed again: its tasks' ends say nothing about the job.
STOPPED_TO_REQUEUE = (JobState.RESTARTING, JobState.PREEMPTED)


def is_live_task(job: Job, task: Task) -> bool:
    """Whether what happens to `task` still matters to the job: its attempt is the job's and the job goes on (its
    success rule has not decided it)."""
    return (
        not job.is_terminal
        and job.ending in ("", JobState.FAILED)  # a failure awaiting its peers' word may still become a restart
        and job.state not in STOPPED_TO_REQUEUE
        and task.attempt == job.attempt
    )


# Asked at every exit of a gang whose end is decided (once per task): compiled once
# (orchestrator/plumbing/compiled_reads.py).
_AN_ACTIVE_TASK = CompiledRead(
    lambda job_ids: Task.objects.filter(job_id__in=job_ids, state__in=ACTIVE_TASK_STATES).order_by().only("pk")[:1]
)


def _has_active_tasks(job: Job) -> bool:
    return bool(_AN_ACTIVE_TASK([job.pk]))


WAITING_FOR_OTHERS = "; waiting for the job's other tasks to end"


AWAITING_PEERS = "; failing unless a peer's host proves lost within "


def awaiting_peers(wait: timedelta) -> str:
    return f"{AWAITING_PEERS}{wait.seconds} s (a lost host makes its peers fail)"


def succeed(job: Job, reason: str) -> None:
    """The job's success rule decided it: it is `succeeded` once every task of it has ended. MultiWorkerMirrored
    workers end by themselves (they get FINISH_GRACE, reap_finished_jobs); ParameterServer workers and ps only
    serve (`Server.join()`) and never do, so they are stopped now. Either way a task stopped so ends `killed`, its
    detail naming the success rule."""
    if not _has_active_tasks(job):
        end_job(job, JobState.SUCCEEDED, reason)
        return
    job.ending, job.ending_at, job.reason = JobState.SUCCEEDED, timezone.now(), reason + WAITING_FOR_OTHERS
    save_fields(job, ["ending", "ending_at", "reason"])
    log.info("job %s %s: waiting for its other tasks", job.pk, reason)
    if job.strategy == Strategy.PARAMETER_SERVER:
        stop_tasks(job, f"stopped by the job's success rule ({reason})")


def _maybe_final(job: Job) -> None:
    """A task of the job ended: the job takes the state its success rule decided once it was the last."""
    if job.ending and not job.is_terminal and not _has_active_tasks(job):
        failed = job.failed_task if job.ending == JobState.FAILED else None
        end_job(job, job.ending, without_suffix(job.reason), failed=failed)


def without_suffix(reason: str) -> str:
    """The decided reason, without what it was waiting for."""
    return reason.removesuffix(WAITING_FOR_OTHERS).split(AWAITING_PEERS)[0]


def finish_task(task: Task, state: str, code: int | None, detail: str, now: Any) -> None:
    task.state, task.exit_code, task.finished_at = state, code, now
    if detail:
        task.detail = detail[:2000]
    save_fields(task, ["state", "exit_code", "finished_at", "detail", "event_seq"])
    usage_recording.task_ended(task)  # its device-seconds, once, in this transaction (and fair share's memory)
    if task.job.state in DIAGNOSED_STATES and not _has_active_tasks(task.job):
        # The last of a failed gang ended: the peers stopped after the job's end are judged too (once, not per task).
        diagnose_after_commit(task.job_id, fresh=True)
    _maybe_final(task.job)


def stop_tasks(job: Job, reason: str, *, types: tuple[str, ...] | None = None) -> list[Task]:
    active_tasks = job.tasks.filter(state__in=ACTIVE_TASK_STATES).exclude(state=TaskState.STOPPING)
    if types is not None:
        active_tasks = active_tasks.filter(type__in=types)
    active = list(tasks_locked(active_tasks.select_related("host")))  # the job's row is locked: row_locks.py
    Task.objects.filter(pk__in=[t.pk for t in active]).update(state=TaskState.STOPPING)
    if active:
        live.job_changed(job.pk)
    kill_later(active, reason)
    return active


def end_job(job: Job, state: str, reason: str, failed: Task | None = None) -> None:
    job.state, job.reason, job.finished_at = state, reason, timezone.now()
    job.failed_task = failed
    job.ending = ""
    save_fields(job, ["state", "reason", "finished_at", "failed_task", "ending"])
    log.info("job %s %s: %s", job.pk, state, reason)
    if state in DIAGNOSED_STATES:
        diagnose_after_commit(job.pk)  # why it failed, once its tasks' rows are committed
    if state == JobState.SUCCEEDED:
        pass  # every task has ended (succeed)
    else:
        # The rest of a failed gang would wait forever for its peer.
        stop_tasks(job, f"job {state}")
    if not _has_active_tasks(job) or job.preflight_for_id:  # a preflight's end clears or refuses its job: a pass
        schedule_later(job.cluster_id)
    if (running := preflight.awaited(job.preflight)) is not None:  # it ended while its preflight ran (a cancel)
        transaction.on_commit(lambda: cancel(running, f"the end of job #{job.pk}, which it checks"))


def cancel(job_id: int, by: str) -> bool:
    """Cancel a job in any non-final state; its processes are killed. Returns False when it had already ended."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.is_terminal:
            return False
        end_job(job, JobState.CANCELLED, f"cancelled by {by}")
    return True


def last_epoch(job: Job) -> int:
    """The last epoch the job completed (epochs count from 1; 0: none yet), as the task that speaks for the job
    reported it: the runtime backs up before it reports an epoch's end, and a peer's report may run ahead."""
    task_type, task_index = speaks_for_job(job.strategy)
    done = MetricPoint.objects.filter(
        job=job, phase="epoch_end", task__type=task_type, task__index=task_index
    ).aggregate(last=Max("epoch"))["last"]
    return int(done or 0)


def preempt(job_id: int, *, by: int, why: str, protection: preemption.Protection) -> bool:
    """Stop a running job's gang for job #`by` and queue it again with its place kept (its `created_at`); it resumes
    from its last checkpoint. Not a failure: no restart is used. Once it reached its class's bound on preemptions
    (`protection`), it is shielded from more until it ends. False when it was no longer running."""
    job = Job.objects.select_for_update().get(pk=job_id)
    if job.state not in (JobState.STARTING, JobState.RUNNING) or job.ending:
        return False  # (a job whose success rule decided it only waits for its last tasks to end)
    # The epoch it is in when stopped (its last checkpoint is the one before, or this one's end if it finishes it
    # within the grace); "resumed at epoch ..." says where it went on from.
    at = f"in epoch {last_epoch(job) + 1}"
    job.state, job.preemptions = JobState.PREEMPTED, job.preemptions + 1
    now = timezone.now()
    before = JobEvent.objects.filter(job=job, kind="preempted").values_list("at", flat=True)
    job.preemption_shielded = preemption.reaches_bound(
        [t.timestamp() for t in before] + [now.timestamp()], now.timestamp(), protection
    )
    shield = f"; {SHIELDED.format(times=job.preemptions)}" if job.preemption_shielded else ""
    job.reason = (
        f"preempted by #{by} ({why}) {at}; back in the queue with its place kept, to resume from its checkpoint{shield}"
    )
    save_fields(job, ["state", "preemptions", "preemption_shielded", "reason"])
    JobEvent.objects.create(job=job, kind="preempted", text=f"preempted by #{by} ({why}) {at}{shield}")
    log.warning("job %s preempted by job %s: %s", job.pk, by, why)
    stop_tasks(job, f"preempted by job #{by}")
    schedule_later(job.cluster_id)
    return True


def resumed(jobs: list[Job], hosts_of: dict[int, list[str]]) -> None:
    """Preempted jobs placed again: their story says where (and, once its process says, from which epoch)."""
    JobEvent.objects.bulk_create(JobEvent.resuming(job, hosts_of[job.pk]) for job in jobs)
