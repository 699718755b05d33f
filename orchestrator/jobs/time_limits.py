"""Where a job's time limit is enforced (`check_time_limits`: its run, from each placement, ends `timed out`; its tasks
get SIGTERM, the cluster's grace, then SIGKILL) and its startup deadline (`check_startup_deadlines`: a gang not all
running and connected in time fails, since TF itself waits forever). The watchdog asks both every tick
(orchestrator/tasks.py)."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from orchestrator.jobs.lifecycle import (
    end_job,
    last_epoch,
)
from orchestrator.models import (
    Job,
    JobEvent,
    JobState,
    Task,
    TaskState,
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
            end_job(job, JobState.TIMED_OUT, f"time limit of {limit} s reached (after epoch {epoch})" if epoch
                     else f"time limit of {limit} s reached")  # fmt: skip
            JobEvent.objects.create(job=job, kind="timed_out", text=job.reason)
            ended.append(job_id)
    return ended


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
            end_job(
                job,
                JobState.FAILED,
                f"not all tasks running and connected within {job.startup_deadline_s} s: {details}",
                failed=waiting[0] if waiting else None,
            )
            failed.append(job_id)
    return failed


def _waiting_for(task: Task) -> str:
    if task.state == TaskState.PENDING:
        return "not started (the agent never confirmed the launch)"
    if task.state == TaskState.STARTING:
        return f"started but not listening on port {task.port}"
    return task.state
