"""Metric points: the rows a batch of a task's events yields, and their idempotent bulk upsert."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from contracts.names import METRIC_NAME
from orchestrator import limits
from orchestrator.metrics import live
from orchestrator.metrics.lookups import DROPPED
from orchestrator.models import Job, MetricPoint, Task
from orchestrator.models.points import number_points
from orchestrator.plumbing import counters

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


def within_limits(rows: list[PointRow]) -> tuple[list[PointRow], dict[int, int]]:
    """The rows each job may still store (limits.keep_point, against its `points_stored`), and how many were left out
    per job. Read without a lock: one ingest consumer writes points (metrics/stream.py), and counters move with F()."""
    counts = Job.objects.filter(pk__in={r[0] for r in rows}).values_list("pk", "points_stored", "points_thinned")
    stored = {pk: n for pk, n, _thinned in counts}
    if all(n < settings.TFDASH_MAX_POINTS_PER_JOB - len(rows) for n in stored.values()):
        return rows, {}  # the common case: no job near its limit, nothing to look at
    never_thinned = {pk for pk, _n, thinned in counts if not thinned}
    existing = _existing(rows)
    kept: list[PointRow] = []
    left_out: dict[int, int] = defaultdict(int)
    for row in rows:
        job_id = row[0]
        if (row[1], row[2], row[3], row[4]) in existing:
            kept.append(row)  # a redelivery of a stored point: updated in place, it takes no new room
        elif limits.keep_point(stored.get(job_id, 0), row[2], row[4]):
            kept.append(row)
            stored[job_id] = stored.get(job_id, 0) + 1
        else:
            left_out[job_id] += 1
    for job_id in never_thinned & left_out.keys():
        live.job_changed(job_id)  # its page says the series are thinned from now on
    return kept, dict(left_out)


def _existing(rows: list[PointRow]) -> set[tuple[int, str, str, int]]:
    """The (task, phase, name, step) keys among `rows` that are stored already."""
    keys = list({(r[1], r[2], r[3], r[4]) for r in rows})
    with connection.cursor() as cursor:
        cursor.execute(_EXISTING_SQL, [list(column) for column in zip(*keys, strict=True)])
        return {(task, phase, name, step) for task, phase, name, step in cursor.fetchall()}


def count_points(inserted: dict[int, int], left_out: dict[int, int]) -> None:
    """Move the jobs' counters on: points newly stored (not a redelivery's update), points left out; one statement
    for every job of the batch (their rows are locked already: number_points)."""
    jobs = sorted(inserted.keys() | left_out.keys())
    if not jobs:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            _COUNT_SQL, [jobs, [inserted.get(job, 0) for job in jobs], [left_out.get(job, 0) for job in jobs]]
        )


def count_shed(shed: dict[int, int]) -> None:
    """Each task's running total of points its agent shed (contracts/protocol.py SHED_BACKLOG), never lowered: a late
    or repeated report carries a total already passed."""
    tasks = sorted(shed)
    with connection.cursor() as cursor:
        cursor.execute(_SHED_SQL, [tasks, [shed[task] for task in tasks]])


_SHED_SQL = f"""
    UPDATE {Task._meta.db_table} t SET points_shed = n.shed
    FROM unnest(%s::bigint[], %s::bigint[]) AS n(id, shed) WHERE t.id = n.id AND t.points_shed < n.shed
"""  # noqa: S608 - the model's table; values are parameters

_COUNT_SQL = f"""
    UPDATE {Job._meta.db_table} j
    SET points_stored = j.points_stored + n.stored, points_thinned = j.points_thinned + n.thinned
    FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[]) AS n(id, stored, thinned) WHERE j.id = n.id
"""  # noqa: S608 - the model's table; values are parameters


def upsert_points(rows: list[PointRow]) -> tuple[dict[int, list[list[Any]]], dict[int, int]]:
    """Store `rows` idempotently; returns the stored points per job, as POINT_COLUMNS lists in sequence order, and how
    many of them were new rows per job (the rest were a redelivery's updates).

    Each job's new points are numbered from its counter (Job.points_seq, contracts/protocol.py POINT_SEQ), whose row
    stays locked until the commit: two ingest partitions storing points of one job take turns, so a job's numbers grow
    in commit order whichever partition stores them. An upsert, not "ignore": a redelivered point is stored once AND
    gets its number back, so its frame carries the same number and a browser drops the duplicate. One row per (task,
    phase, name, step): the same key twice in one upsert is an error, and the later value is the one to keep (it is
    what a redelivery would leave too).

    The rows travel by binary COPY into a session-temporary staging table, then one INSERT ... SELECT upserts them
    and returns each stored point whole. Measured on the 2-core machine, 200,000 points: the earlier single INSERT
    over unnest() of column arrays spent 2.3 s of the ingest's CPU quoting those arrays as text (psycopg's client-side
    binding), the COPY 0.4 s; the server's upsert costs the same either way (bench/pipeline.py, README Sizing).
    """
    unique = list({(r[1], r[2], r[3], r[4]): r for r in rows}.values())
    per_job: dict[int, int] = defaultdict(int)
    for row in unique:
        per_job[row[0]] += 1
    with transaction.atomic(), connection.cursor() as cursor:
        # A redelivered point keeps the number it has; a new one takes the next of its job's (gaps are harmless).
        next_seq = number_points(per_job)
        raw = cursor.cursor  # psycopg's own cursor: Django's wrapper has no copy()
        raw.execute(_STAGING_SQL)
        raw.execute(_EMPTY_SQL)  # whatever an earlier failed run left
        with raw.copy(_COPY_SQL) as copy:
            copy.set_types(_STAGING_TYPES)
            for row in unique:
                if row[0] in next_seq:  # a job deleted meanwhile stores nothing
                    copy.write_row((*row, next_seq[row[0]]))
                    next_seq[row[0]] += 1
        raw.execute(_UPSERT_SQL)
        returned = raw.fetchall()
    inserted: dict[int, int] = defaultdict(int)
    by_job: dict[int, list[list[Any]]] = defaultdict(list)
    for seq, job_id, task_id, phase, name, step, epoch, value, ts, is_new in returned:
        by_job[job_id].append([seq, task_id, phase, name, step, epoch, value, ts])
        inserted[job_id] += is_new
    for points in by_job.values():
        points.sort(key=lambda p: p[0])
    return by_job, dict(inserted)


_EXISTING_SQL = f"""
    SELECT p.task_id, p.phase, p.name, p.step FROM {MetricPoint._meta.db_table} p
    JOIN unnest(%s::bigint[], %s::varchar[], %s::varchar[], %s::bigint[]) AS k(task_id, phase, name, step)
    USING (task_id, phase, name, step)
"""  # noqa: S608 - the table name is the model's; values are parameters

_STAGING = "tfdash_point_staging"
_STAGING_TYPES = ["int8", "int8", "varchar", "varchar", "int8", "int4", "float8", "float8", "int8"]
# Temporary: this connection's own, never logged, emptied at every commit, gone with the session.
_STAGING_SQL = f"""
    CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGING} (job_id bigint, task_id bigint, phase varchar, name varchar,
        step bigint, epoch integer, value double precision, ts double precision, seq bigint) ON COMMIT DELETE ROWS
"""
_COPY_SQL = f"COPY {_STAGING} (job_id, task_id, phase, name, step, epoch, value, ts, seq) FROM STDIN (FORMAT BINARY)"

_EMPTY_SQL = f"TRUNCATE {_STAGING}"

# The table name comes from the model, never from input; values come from the staging table. `xmax = 0`: the row was
# inserted, not updated (PostgreSQL), which keeps the job's point count exact under redelivery.
_UPSERT_SQL = f"""
    INSERT INTO {MetricPoint._meta.db_table} (job_id, task_id, phase, name, step, epoch, value, ts, seq)
    SELECT job_id, task_id, phase, name, step, epoch, value, ts, seq FROM {_STAGING}
    ON CONFLICT (task_id, phase, name, step) DO UPDATE
        SET value = EXCLUDED.value, ts = EXCLUDED.ts, epoch = EXCLUDED.epoch
    RETURNING seq, job_id, task_id, phase, name, step, epoch, value, ts, (xmax = 0)
"""  # noqa: S608
