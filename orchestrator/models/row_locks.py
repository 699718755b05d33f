"""The one order in which transactions lock job and task rows: a job's row before any task's, and several rows of a
kind in id order. A transaction that holds a task's row never then waits for a job's.

Two transactions that both keep to it may wait for each other, never in a circle. Two that did not deadlocked, and
PostgreSQL aborted one: an ingest batch wrote a task's facts and then its job's while a cancel held the job and was
stopping its tasks in the table's physical order, and the user's cancel answered 500."""

from __future__ import annotations

from collections.abc import Collection

from django.db import connection
from django.db.models import QuerySet

from orchestrator.models.jobs import Job, Task

_JOB_TABLE, _TASK_TABLE = Job._meta.db_table, Task._meta.db_table

# The jobs named and the jobs of the tasks named, each row locked once, in id order (ORDER BY runs before FOR UPDATE).
_LOCK_JOBS_SQL = f"""
    SELECT j.id FROM {_JOB_TABLE} j
    WHERE j.id IN (
        SELECT unnest(%s::bigint[]) UNION SELECT t.job_id FROM {_TASK_TABLE} t WHERE t.id = ANY(%s::bigint[])
    )
    ORDER BY j.id FOR UPDATE OF j
"""  # noqa: S608 - the models' tables; values are parameters


def lock_rows(*, jobs: Collection[int] = (), tasks: Collection[int] = ()) -> None:
    """Lock the rows of `jobs` and of the jobs of `tasks`, then those of `tasks`, in the order above: a transaction
    that writes to rows of several jobs and tasks (the metrics ingest) takes them all first. Call inside a
    transaction."""
    job_ids, task_ids = sorted(set(jobs)), sorted(set(tasks))
    if job_ids or task_ids:
        with connection.cursor() as cursor:
            cursor.execute(_LOCK_JOBS_SQL, [job_ids, task_ids])
    if task_ids:
        lock_tasks(task_ids)


def lock_tasks(task_ids: Collection[int]) -> None:
    """Lock these tasks' rows in id order, and not their jobs' (the caller holds them, or takes none)."""
    list(tasks_locked(Task.objects.filter(pk__in=task_ids)).values_list("pk", flat=True))


def tasks_locked(tasks: QuerySet[Task]) -> QuerySet[Task]:
    """`tasks`, their rows locked in id order (their jobs' rows the caller locked first, if it needs them)."""
    return tasks.select_for_update(of=("self",)).order_by("pk")
