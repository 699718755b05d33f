"""What agents dropped of their tasks' output for the per-task bounds (contracts/publish_limits.py): taken from the
reports' running totals (TaskMetricsBatch.dropped, TaskLogBatch.dropped), kept on each task as the highest seen (a
late, lost or repeated report never lowers one), and said on the job page and in the API."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Sum

from contracts.publish_limits import (
    ARTIFACT_RATE_WORDS,
    LOG_BYTES_PER_S,
    MAX_ARTIFACTS_PER_TASK,
    METRIC_BYTES_PER_S,
)
from orchestrator.models import Job, Task

# The reports' keys and the task's columns that keep them.
COLUMNS = {
    "artifacts": "artifacts_dropped",
    "artifact_bytes": "artifact_bytes_dropped",
    "log_lines": "log_lines_dropped",
    "metric_lines": "metric_lines_dropped",
}
_MAX_COUNT = 2**62

Drops = dict[str, int]


def reported(raw: Any) -> Drops:
    """The totals a report carries that make sense (a non-negative int under a known key); the rest is ignored."""
    if not isinstance(raw, dict):
        return {}
    return {
        key: value for key, value in raw.items() if key in COLUMNS and type(value) is int and 0 < value < _MAX_COUNT
    }


def merge(into: dict[int, Drops], task_id: int, drops: Drops) -> None:
    """Add one report's totals for `task_id` to a batch's, keeping the highest of each."""
    if not drops:
        return
    held = into.setdefault(task_id, {})
    for key, value in drops.items():
        held[key] = max(value, held.get(key, 0))


def store(drops: dict[int, Drops]) -> None:
    """Raise each task's kept totals to what the batch saw, in one statement (never lowered)."""
    tasks = sorted(task for task, held in drops.items() if held)
    if not tasks:
        return
    columns = [[drops[task].get(key, 0) for task in tasks] for key in COLUMNS]
    with connection.cursor() as cursor:
        cursor.execute(_STORE_SQL, [tasks, *columns])


_SET = ", ".join(f"{column} = GREATEST(t.{column}, n.{key})" for key, column in COLUMNS.items())
_ARRAYS = ", ".join("%s::bigint[]" for _key in COLUMNS)
_STORE_SQL = f"""
    UPDATE {Task._meta.db_table} t SET {_SET}
    FROM unnest(%s::bigint[], {_ARRAYS}) AS n(id, {", ".join(COLUMNS)}) WHERE t.id = n.id
"""  # noqa: S608 - the model's table and fixed column names; values are parameters


def of_task(task: Task) -> Drops:
    """A task's kept totals, every kind (0 when nothing was dropped): the API's `output_dropped`."""
    return {key: getattr(task, column) for key, column in COLUMNS.items()}


def job_note(job: Job) -> str:
    """What the job page says when its tasks' agents dropped output ("" when none), with the bounds that did it."""
    totals = job.tasks.aggregate(**{key: Sum(column) for key, column in COLUMNS.items()})
    parts = []
    if totals["artifacts"]:
        parts.append(
            f"{totals['artifacts']:,} artifacts ({totals['artifact_bytes'] or 0:,} bytes) over the per-task bound of "
            f"{MAX_ARTIFACTS_PER_TASK} artifacts and {ARTIFACT_RATE_WORDS}"
        )
    if totals["log_lines"]:
        parts.append(
            f"{totals['log_lines']:,} log lines over {LOG_BYTES_PER_S // 1024:,} KiB/s of output per task (the log "
            'says "lines dropped" where)'
        )
    if totals["metric_lines"]:
        parts.append(f"{totals['metric_lines']:,} metric lines over {METRIC_BYTES_PER_S // 1024:,} KiB/s per task")
    if not parts:
        return ""
    return "Output dropped by the agents for the per-task bounds: " + "; ".join(parts) + "."
