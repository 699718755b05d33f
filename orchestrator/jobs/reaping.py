"""What still runs of jobs whose end is decided, stopped by the watchdog (`reap_finished_jobs`): tasks of a final job
still running FINISH_GRACE after its end, a failure that waited for its peers' word long enough, and the tasks a
success rule left running past the grace."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from orchestrator.jobs.lifecycle import (
    end_job,
    peer_word_wait,
    stop_tasks,
    without_suffix,
)
from orchestrator.models import (
    ACTIVE_TASK_STATES,
    TERMINAL_JOB_STATES,
    Job,
    JobState,
    Task,
    TaskState,
)

# After the chief (or worker 0) succeeded, other workers may still be finishing their last step or writing their
# temporary checkpoints (TF_NOTES: up to ~30 s): they get this long to exit by themselves before they are killed.
FINISH_GRACE = timedelta(seconds=60)


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
            stopped += len(stop_tasks(job, f"still running {FINISH_GRACE.seconds} s after the job {job.state}"))
    awaited = timezone.now() - peer_word_wait()
    for job_id in Job.objects.filter(ending=JobState.FAILED, ending_at__lt=awaited).values_list("pk", flat=True):
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            if job.ending == JobState.FAILED and not job.is_terminal:
                # No peer's host was lost: the failure was the program's own.
                stopped += job.tasks.filter(state__in=ACTIVE_TASK_STATES).exclude(state=TaskState.STOPPING).count()
                end_job(job, JobState.FAILED, without_suffix(job.reason), failed=job.failed_task)
    for job_id in Job.objects.filter(ending=JobState.SUCCEEDED, ending_at__lt=cutoff).values_list("pk", flat=True):
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            if job.ending and not job.is_terminal:
                reason = f"stopped by the job's success rule: still running {FINISH_GRACE.seconds} s after it"
                stopped += len(stop_tasks(job, reason))
    return stopped
