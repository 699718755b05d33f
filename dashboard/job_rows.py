"""What the jobs list shows beside a job's fields: how long it ran, how far it is (epoch k of n, for a job that runs),
and why it failed. One query for the progress of all the rows shown, however many points their jobs hold."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection
from django.utils import timezone

from dashboard.compare import format_seconds
from orchestrator.models import Job, JobState, MetricPoint

LIVE_STATES = (JobState.STARTING, JobState.RUNNING, JobState.RESTARTING)
_LATEST_EPOCH_SQL = f"""
    SELECT j.id, p.epoch FROM unnest(%s::bigint[]) AS j(id)
    CROSS JOIN LATERAL (
        SELECT epoch FROM {MetricPoint._meta.db_table}
        WHERE job_id = j.id AND epoch IS NOT NULL ORDER BY id DESC LIMIT 1
    ) p
"""  # noqa: S608 - the table name is the model's; the ids are a parameter


@dataclass(frozen=True)
class JobRow:
    job: Job
    duration: str
    progress: str
    failure: str


def rows(jobs: list[Job]) -> list[JobRow]:
    epochs = latest_epochs([job.pk for job in jobs if job.state in LIVE_STATES])
    now = timezone.now()
    return [JobRow(job, _duration(job, now), _progress(job, epochs.get(job.pk)), _failure(job)) for job in jobs]


def any_live(jobs: list[Job]) -> bool:
    return any(job.state in LIVE_STATES or job.state == JobState.QUEUED for job in jobs)


def latest_epochs(job_ids: list[int]) -> dict[int, int]:
    """The epoch of each job's newest point (epochs count from 1: the one in progress or just finished)."""
    if not job_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(_LATEST_EPOCH_SQL, [job_ids])
        return {job_id: epoch for job_id, epoch in cursor.fetchall()}


def _duration(job: Job, now) -> str:  # type: ignore[no-untyped-def]
    if job.started_at is None:
        return ""
    return format_seconds(((job.finished_at or now) - job.started_at).total_seconds())


def _progress(job: Job, epoch: int | None) -> str:
    if epoch is None:
        return ""
    total = (job.builtin_config or {}).get("epochs")
    return f"epoch {epoch} of {total}" if isinstance(total, int) else f"epoch {epoch}"


def _failure(job: Job) -> str:
    return job.reason if job.state == JobState.FAILED else ""
