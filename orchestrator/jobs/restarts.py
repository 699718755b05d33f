"""What a live task's failure does to its job, by its restart policy (orchestrator/core/restarts.py): the gang is
stopped and placed again (`restart_job`), a ParameterServer worker is relaunched in place, the verdict waits for word of
its peers' hosts, or the job fails (`task_failed`). Tasks whose processes are gone, a host that went silent among them,
go the same way (`lose_tasks`, `host_lost`)."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from orchestrator.core import restarts as restart_policy
from orchestrator.jobs import dispatch
from orchestrator.jobs.lifecycle import (
    awaiting_peers,
    end_job,
    finish_task,
    is_live_task,
    peer_word_wait,
    schedule_later,
    stop_tasks,
)
from orchestrator.models import (
    ACTIVE_TASK_STATES,
    Job,
    JobState,
    Strategy,
    Task,
    TaskState,
    TaskType,
)
from orchestrator.models.row_locks import tasks_locked
from orchestrator.plumbing.compiled_writes import save_fields

log = logging.getLogger(__name__)


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
            why = "its host is gone" if host_gone else why_no_restart(job, retryable)
            job.reason = f"{reason}; training goes on without it ({why})"
            save_fields(job, ["reason"])
        return
    if allowed:
        restart_job(job, reason, failed=task)
        return
    if retryable and job.max_restarts:
        reason = f"{reason} ({why_no_restart(job, retryable)})"
    if _peers_still_running(job, task):
        # A peer's host may be what failed this task (a lost chief fails its workers first): the verdict waits for
        # the host to be judged. Its loss restarts the job (lose_tasks); else the job fails as it would have.
        wait = peer_word_wait()
        job.ending, job.ending_at, job.failed_task = JobState.FAILED, timezone.now(), task
        job.reason = reason + awaiting_peers(wait)
        save_fields(job, ["ending", "ending_at", "failed_task", "reason"])
        log.info("job %s: %s; awaiting its peers' word for %s s", job.pk, reason, wait.seconds)
        return
    end_job(job, JobState.FAILED, reason, failed=task)


def _peers_still_running(job: Job, task: Task) -> bool:
    """Whether other tasks of the gang still run on other hosts (whose loss could explain this failure)."""
    if job.restarts >= job.max_restarts or not restart_policy.retryable(job.restart_policy, None, lost=True):
        return False  # a lost host could not restart the job either: nothing to wait for
    return (
        job.tasks.filter(attempt=job.attempt, state__in=ACTIVE_TASK_STATES)
        .exclude(state=TaskState.STOPPING)
        .exclude(host_id=task.host_id)
        .exists()
    )


def _is_ps_worker(job: Job, task: Task) -> bool:
    return job.strategy == Strategy.PARAMETER_SERVER and task.type == TaskType.WORKER


def why_no_restart(job: Job, retryable: bool) -> str:
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
    stop_tasks(job, f"restarting the job: {reason}")
    schedule_later(job.cluster_id)


def _relaunch_in_place(job: Job, task: Task, reason: str) -> None:
    """A new row for the same slot (type, index, host, port, TF_CONFIG), launched at once."""
    job.restarts += 1
    job.restart_reason = reason
    job.reason = f"{reason}; relaunched in place (restart {job.restarts} of {job.max_restarts})"
    save_fields(job, ["restarts", "restart_reason", "reason"])
    now = timezone.now()
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
        ordered_at=now,  # its launch goes out on commit
        placed_at=now,  # it holds the slot's devices from now (orchestrator/usage/)
    )
    log.warning("job %s: %s; relaunching it in place", job.pk, reason)
    transaction.on_commit(lambda: dispatch.launch_tasks([again.pk]))


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
    live = [t for t, _ in gone if is_live_task(job, t) and t.state != TaskState.STOPPING]
    for task, detail in gone:
        task.job = job  # the locked row: the last one's end may make the job final
        finish_task(task, stopping_as if task.state == TaskState.STOPPING else TaskState.LOST, None, detail, now)
    if live:
        first = ([t for t in live if not _is_ps_worker(job, t)] or live)[0]
        first.job = job  # the locked row
        retryable = restart_policy.retryable(job.restart_policy, None, lost=True)
        names = ", ".join(str(t) for t in live)
        task_failed(first, f"{reason}; lost {names}", retryable, host_gone=host_gone)
    # Their ports and devices are free now.
    schedule_later(job.cluster_id)
