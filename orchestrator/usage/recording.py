"""A task's device-seconds added to the daily rollup at its end (`task_ended`), exactly once, and to fair share's
memory of its owner's use (decay.py).

Called by orchestrator/jobs/lifecycle.py `finish_task`, inside the transaction that ends the task: the claim
(`usage_recorded` false -> true, a conditional UPDATE) and the rollup's upsert commit with the end itself, so an end
delivered twice, or a task ended by two paths (lost, then its exit), adds its seconds once, and a rolled-back end adds
none."""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from orchestrator.models import Task, UsageDay, device_kind
from orchestrator.usage import decay
from orchestrator.usage.days import split_by_day

_TABLE = UsageDay._meta.db_table
_ROW = "(%s, %s, %s, %s, %s, 1)"
_UPSERT = f"""
    INSERT INTO {_TABLE} (day, cluster_id, user_id, kind, device_seconds, tasks) VALUES {{rows}}
    ON CONFLICT (day, cluster_id, user_id, kind) DO UPDATE
    SET device_seconds = {_TABLE}.device_seconds + EXCLUDED.device_seconds, tasks = {_TABLE}.tasks + EXCLUDED.tasks
"""  # noqa: S608 - the table's name from the model, every value a parameter


def held_from(placed_at: datetime | None, started_at: datetime | None) -> datetime | None:
    """When a task began to hold its devices: its placement; a row placed before placements were stored counts from
    its start."""
    return placed_at or started_at


def task_ended(task: Task) -> bool:
    """Add the ended `task`'s device-seconds (devices held x placement to end, split at UTC midnights) to its job's
    owner's and cluster's days. False when they were added already (a duplicate end). A task that held no device (a
    chief or ps) is claimed and adds nothing."""
    if not Task.objects.filter(pk=task.pk, usage_recorded=False).update(usage_recorded=True):
        return False
    task.usage_recorded = True
    start, end, devices = held_from(task.placed_at, task.started_at), task.finished_at, len(task.devices or ())
    if start is None or end is None or not devices:
        return True
    parts = split_by_day(start, end)
    if not parts:
        return True
    job = task.job
    kind = device_kind(task.host.gpus if task.host_id else None)
    values: list[object] = []
    for day, seconds in parts:  # in day order: concurrent ends lock shared rows in one order
        values += [day, job.cluster_id, job.owner_id, kind, devices * seconds]
    with connection.cursor() as cursor:
        cursor.execute(_UPSERT.format(rows=", ".join([_ROW] * len(parts))), values)
    decay.add_ended(job, devices, start, end)
    return True
