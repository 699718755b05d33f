"""Metric points: the rows a batch of a task's events yields, and their idempotent bulk upsert."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from django.db import connection

from contracts.names import METRIC_NAME
from orchestrator import counters
from orchestrator.metrics.lookups import DROPPED
from orchestrator.models import MetricPoint, Task

MAX_EVENTS_PER_BATCH = 5000
# A point before it is stored: (job, task, phase, name, step, epoch, value, ts), the columns of POINT_COLUMNS after id.
PointRow = tuple[int, int, str, str, int, int | None, float, float]
_BIGINT = 2**63
_INT = 2**31
_good_names: set[str] = set()  # names seen valid: a run of reports repeats the same few


def _valid_name(name: Any) -> bool:
    if name in _good_names:
        return True
    if isinstance(name, str) and METRIC_NAME.match(name):
        if len(_good_names) < 10_000:
            _good_names.add(name)
        return True
    return False


def metric_rows(task: Task, events: list[Any]) -> tuple[list[PointRow], dict[str, Any] | None]:
    """Rows for every finite numeric value in the batch's metric events, and the last facts object in it."""
    rows: list[PointRow] = []
    facts = None
    job_id, task_id = task.job_id, task.pk
    for event in events[:MAX_EVENTS_PER_BATCH]:
        if not isinstance(event, dict):
            continue
        kind = event.get("kind")
        if kind == "facts" and isinstance(event.get("facts"), dict):
            facts = event["facts"]
            continue
        metrics = event.get("metrics")
        if kind != "metric" or not isinstance(metrics, dict):
            continue
        try:
            step = int(event["step"])
            ts = float(event["ts"])
            epoch = None if event.get("epoch") is None else int(event["epoch"])
            # Out of the columns' range would fail the whole transaction; it is a malformed event.
            if not (-_BIGINT <= step < _BIGINT and math.isfinite(ts) and (epoch is None or -_INT <= epoch < _INT)):
                raise ValueError("out of range")
        except (KeyError, TypeError, ValueError, OverflowError):
            counters.incr(DROPPED)
            continue
        phase = str(event.get("phase") or "custom")[:10]
        for name, reported in metrics.items():
            if isinstance(reported, bool) or not isinstance(reported, int | float) or not _valid_name(name):
                continue
            value = float(reported)
            if math.isfinite(value):
                rows.append((job_id, task_id, phase, name, step, epoch, value, ts))
    return rows, facts


def upsert_points(rows: list[PointRow]) -> dict[int, list[list[Any]]]:
    """Store `rows` idempotently; returns the stored points per job, as POINT_COLUMNS lists in id order.

    An upsert, not "ignore": a redelivered point is stored once AND gets its id back, so its frame carries the same id
    and a browser drops the duplicate. One row per (task, phase, name, step): the same key twice in one upsert is an
    error, and the later value is the one to keep (it is what a redelivery would leave too).
    """
    unique = list({(r[1], r[2], r[3], r[4]): r for r in rows}.values())
    # One statement over column arrays: no model instance and no SQL compiled per row (that was ~80% of the time
    # with bulk_create: measured 7,400 points/s in-process, profiled).
    with connection.cursor() as cursor:
        cursor.execute(_UPSERT_SQL, [list(column) for column in zip(*unique, strict=True)])
        ids = {(task, phase, name, step): pk for pk, task, phase, name, step in cursor.fetchall()}
    by_job: dict[int, list[list[Any]]] = defaultdict(list)
    for j, t, ph, n, st, ep, v, ts in unique:
        by_job[j].append([ids[(t, ph, n, st)], t, ph, n, st, ep, v, ts])
    for points in by_job.values():
        points.sort(key=lambda p: p[0])
    return by_job


# The table name comes from the model, never from input; every value is a bound parameter.
_UPSERT_SQL = f"""
    INSERT INTO {MetricPoint._meta.db_table} (job_id, task_id, phase, name, step, epoch, value, ts)
    SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::varchar[], %s::varchar[], %s::bigint[], %s::integer[],
                         %s::double precision[], %s::double precision[])
    ON CONFLICT (task_id, phase, name, step) DO UPDATE
        SET value = EXCLUDED.value, ts = EXCLUDED.ts, epoch = EXCLUDED.epoch
    RETURNING id, task_id, phase, name, step
"""  # noqa: S608
