"""What the jobs list shows beside a job's fields: how long it ran, how far it is (epoch k of n and its ETA, from
Job.progress, which the ingest keeps: no query), and why it failed."""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.utils import timezone

from dashboard.compare import format_seconds
from orchestrator.core import progress
from orchestrator.models import Job, JobState

LIVE_STATES = (JobState.STARTING, JobState.RUNNING, JobState.RESTARTING)


@dataclass(frozen=True)
class JobRow:
    job: Job
    duration: str
    progress: str
    failure: str


def rows(jobs: list[Job]) -> list[JobRow]:
    now = timezone.now()
    return [JobRow(job, _duration(job, now), progress_text(job, short=True), _failure(job)) for job in jobs]


def any_live(jobs: list[Job]) -> bool:
    return any(job.state in LIVE_STATES or job.state == JobState.QUEUED for job in jobs)


def progress_text(job: Job, *, short: bool = False) -> str:
    """The job's progress in words (orchestrator/core/progress.py describe), its ETA only while it runs: the jobs list
    (short: "epoch 3/10 · ETA 2 min") and the job page."""
    return progress.describe(job.progress, now=time.time(), running=job.state == JobState.RUNNING, short=short)


def _duration(job: Job, now) -> str:  # type: ignore[no-untyped-def]
    if job.started_at is None:
        return ""
    return format_seconds(((job.finished_at or now) - job.started_at).total_seconds())


def _failure(job: Job) -> str:
    """Why it failed or timed out: its verdict's title (Job.diagnosis, on the row: no query), else a failed job's
    reason."""
    if job.state not in (JobState.FAILED, JobState.TIMED_OUT):
        return ""
    title = job.diagnosis.get("title") if isinstance(job.diagnosis, dict) else None
    if isinstance(title, str) and title:
        return f"why: {title}"
    return job.reason if job.state == JobState.FAILED else ""
