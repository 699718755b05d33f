"""Reading stored metric points: the one reader behind the job page's socket and `GET /api/jobs/<id>/metrics/`.

A job's points are numbered in commit order (contracts/protocol.py POINT_SEQ, whichever ingest partition stored them),
so "after number N" is well defined: a reader that remembers the highest number it saw asks for exactly what it has
not.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from orchestrator.metrics import rollups
from orchestrator.models import MetricPoint

# The columns of a point row as every reader returns it (and frames announce it: the page reads them from there).
POINT_COLUMNS = ["seq", "task", "phase", "name", "step", "epoch", "value", "ts"]
_VALUES = ("seq", "task_id", "phase", "name", "step", "epoch", "value", "ts")
SERIES_POINTS = 2000  # a fresh load thins each series to about this many


def points_after(
    job_id: int, since: int, *, limit: int | None = None, name: str | None = None, task_id: int | None = None
) -> list[tuple[Any, ...]]:
    """Every point of the job numbered above `since`, in order (at most `limit`), as POINT_COLUMNS rows."""
    points = MetricPoint.objects.filter(job_id=job_id, seq__gt=since).order_by("seq")
    if name is not None:
        points = points.filter(name=name)
    if task_id is not None:
        points = points.filter(task_id=task_id)
    rows = points.values_list(*_VALUES)
    return list(rows[:limit] if limit is not None else rows)


def thinned(job_id: int, after: int = 0) -> tuple[list[list[Any]], int, bool]:
    """A fresh load (or, with `after`, a backlog too long to send whole: the points numbered above that): every series
    whole up to SERIES_POINTS points, a longer one cut to the lowest and the highest
    point of each of SERIES_POINTS / 2 step buckets, in PostgreSQL (reading 400,000 rows into Python to thin them
    there took ~5.6 s: bench/page_load.py). A fresh load of a long job buckets its rollups (metrics/rollups.py: at
    most 16 rows per bucket) and the points above their watermark instead of every point. Returns (points in
    sequence order, the cursor, whether any series was thinned). The cursor is the highest number stored when the
    read began; nothing above it is returned, so a live frame never repeats a history point."""
    rolled = rollups.rolled_to(job_id) if after == 0 else 0
    per_series = SERIES_POINTS // 2  # each drawn as its lowest and highest point
    with transaction.atomic(), connection.cursor() as cursor:
        # No JIT: past a few million points the planner's guess of the rollup rows (the series come from unnest)
        # crosses jit_above_cost, and compiling the plan took 85 ms of a 160 ms read of 7,000 rows at 10 M points.
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(_SERIES_SQL, [job_id, max(after, rolled)])
        tail = cursor.fetchall()
        # per series: [count, first step, last step]; the top: the highest number read
        stats = {(t, p, n): [count, lo, hi] for t, p, n, count, lo, hi, _top in tail}
        top = max([row[6] for row in tail] + [rolled])
        for t, p, n, count, lo, hi in rollups.series(job_id) if rolled else ():
            known = stats.setdefault((t, p, n), [0, lo, hi])
            known[0], known[1], known[2] = known[0] + count, min(known[1], lo), max(known[2], hi)
        if not stats:
            return [], after, False
        small = [(*key, count) for key, (count, _lo, _hi) in stats.items() if count <= SERIES_POINTS]
        large = [(*key, lo, hi) for key, (count, lo, hi) in stats.items() if count > SERIES_POINTS]
        # A large series is bucketed from its rollups when the job has some and the series is long enough to have a
        # level that fits its buckets (rollups.level_for), else from every point.
        levels = {series: rollups.level_for(series[3], series[4], per_series) if rolled else None for series in large}
        from_points = [series for series in large if levels[series] is None]
        from_rollups = [(*series, levels[series]) for series in large if levels[series] is not None]
        points: list[list[Any]] = []
        if small:
            # A fresh load reads each short series whole, by its own index range (a few thousand rows at most); a
            # backlog's counts are of its points only, so it reads the job's points above `after` instead.
            by_series = _SMALL_BY_SERIES_SQL if after == 0 else _SMALL_SQL
            cursor.execute(by_series, [*_columns(small, 3), job_id, after, top])
            points.extend(list(row) for row in cursor.fetchall())
        if from_points:
            cursor.execute(_as_points(_BUCKETS_SQL), [*_columns(from_points, 5), job_id, after, top, per_series])
            points.extend(list(row) for row in cursor.fetchall())
        if from_rollups:
            task, phase, name, lo, hi, level = _columns(from_rollups, 6)
            cursor.execute(
                _as_points(rollups.BUCKETS_SQL),
                {"task": task, "phase": phase, "name": name, "lo": lo, "hi": hi, "level": level, "job": job_id,
                 "rolled": rolled, "top": top, "buckets": per_series},
            )  # fmt: skip
            points.extend(list(row) for row in cursor.fetchall())
    points.sort(key=lambda p: p[0])
    return points, top, bool(large)


def _as_points(buckets_sql: str) -> str:
    """A bucket query's (task, phase, name, lowest, highest) rows as POINT_COLUMNS rows, each bucket's lowest and
    highest point once (the same point when a bucket holds one): unpacked by PostgreSQL, where unpacking 8,000
    arrays in Python took 30-60 ms of a 100 k point page load."""
    return f"""
        SELECT DISTINCT (e)[3]::bigint, b.task_id, b.phase, b.name, (e)[2]::bigint, nullif((e)[4], -1)::integer,
                        (e)[1], (e)[5]
        FROM ({buckets_sql}) AS b(task_id, phase, name, low, high)
        CROSS JOIN LATERAL (VALUES (b.low), (b.high)) AS v(e)
    """  # noqa: S608 - our own queries, values are parameters


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Row tuples as one list per column (the first `width`), for unnest()."""
    return [list(column) for column in zip(*(row[:width] for row in rows), strict=True)]


_TABLE = MetricPoint._meta.db_table
_SERIES_SQL = f"""
    SELECT task_id, phase, name, count(*), min(step), max(step), max(seq)
    FROM {_TABLE} WHERE job_id = %s AND seq > %s GROUP BY task_id, phase, name
"""  # noqa: S608 - the table name is the model's; values are parameters
_SMALL_SQL = f"""
    SELECT p.seq, p.task_id, p.phase, p.name, p.step, p.epoch, p.value, p.ts
    FROM {_TABLE} p
    JOIN unnest(%s::bigint[], %s::varchar[], %s::varchar[]) AS s(task_id, phase, name) USING (task_id, phase, name)
    WHERE p.job_id = %s AND p.seq > %s AND p.seq <= %s
"""  # noqa: S608
# The same rows series by series: each one a range of the (task, phase, name, step) unique index (LATERAL, OFFSET 0
# keeps it per series), where the job-wide form read every point of the job (400,000 rows, 84 ms at 100 k points per
# series, for 200 epoch ends).
_SMALL_BY_SERIES_SQL = f"""
    SELECT p.seq, p.task_id, p.phase, p.name, p.step, p.epoch, p.value, p.ts
    FROM unnest(%s::bigint[], %s::varchar[], %s::varchar[]) AS s(task_id, phase, name)
    CROSS JOIN LATERAL (
        SELECT * FROM {_TABLE} p
        WHERE p.task_id = s.task_id AND p.phase = s.phase AND p.name = s.name
          AND p.job_id = %s AND p.seq > %s AND p.seq <= %s
        OFFSET 0
    ) p
"""  # noqa: S608
# min/max of an array compare element by element: the row with the lowest (highest) value in its bucket, whole.
_BUCKETS_SQL = f"""
    SELECT p.task_id, p.phase, p.name,
           min(ARRAY[p.value, p.step, p.seq, coalesce(p.epoch, -1), p.ts]),
           max(ARRAY[p.value, p.step, p.seq, coalesce(p.epoch, -1), p.ts])
    FROM {_TABLE} p
    JOIN unnest(%s::bigint[], %s::varchar[], %s::varchar[], %s::bigint[], %s::bigint[])
         AS s(task_id, phase, name, lo, hi) USING (task_id, phase, name)
    WHERE p.job_id = %s AND p.seq > %s AND p.seq <= %s
    GROUP BY p.task_id, p.phase, p.name, width_bucket(p.step, s.lo, s.hi + 1, %s)
"""  # noqa: S608
