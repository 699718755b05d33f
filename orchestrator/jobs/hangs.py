"""Hang detection, asked by the watchdog every tick (`check_progress`): a running job that reported nothing new (no
metric point, no log line) for its `progress_timeout_s` is restarted if its policy allows, else failed. Progress is
judged on the orchestrator's clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from orchestrator.core import restarts
from orchestrator.jobs.lifecycle import (
    end_job,
)
from orchestrator.jobs.restarts import restart_job, why_no_restart
from orchestrator.models import (
    Job,
    JobState,
    Task,
    TaskLogLine,
)
from orchestrator.models.row_locks import lock_rows


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
                extra = f" ({why_no_restart(locked, True)})" if locked.max_restarts else ""
                end_job(locked, JobState.FAILED, reason + extra)
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
