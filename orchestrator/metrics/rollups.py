"""Rollups: a long job's metric points summed up per block of steps of each series, at four levels (blocks of 16,
256, 4,096 and 65,536 steps), so its page draws a 10-million-point series from a few thousand rows
(orchestrator/metrics/history.py reads them, each series at the coarsest level still finer than its chart's
buckets: `level_for`).

A job's points are numbered in commit order (Job.points_seq, contracts/protocol.py POINT_SEQ), and every number up to
the committed counter belongs to a committed point (the counter moves in the transaction that stores them). So a
watermark says it all: `Job.points_rolled` = every point numbered up to it is in the rollups, none above it. A run
adds the points between the watermark and the counter to their blocks (an upsert that sums counts and keeps the
lowest and highest point) and moves the watermark, in one transaction: a run cut short adds nothing, and two runs
never add the same points twice (an advisory lock per job; the second skips it). Readers take rollups up to the
watermark and the points above it (the tail, at most about TFDASH_ROLLUP_AFTER_POINTS plus one interval's intake).

Run by Celery beat (`orchestrator.rollups`, every TFDASH_ROLLUP_INTERVAL_S) for every job with at least
TFDASH_ROLLUP_AFTER_POINTS points above its watermark, at most TFDASH_ROLLUP_BATCH points per transaction. The ingest
does not pay for it: a run reads the points back by the (job, seq) index after they were stored. The rows it keeps
are about 7 % of the points' (1/16 + 1/256 + ...).

What a rollup does not follow: a redelivered point stored again with another value after its block was rolled up
(the agents resend the same values, so the block's envelope stays right).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F

from orchestrator.models import Job, MetricPoint, PointRollup

log = logging.getLogger(__name__)

# A block of level L spans 2**L steps. Each level is 16 times the one below: a series spanning S steps is drawn from
# the coarsest level whose blocks fit in S / history's bucket count, so at most 16 rows per bucket are read.
LEVELS = (4, 8, 12, 16)
_LOCK_CLASS = 0x7D0_0001  # pg advisory locks (class, job): "a rollup of this job is running"
RUN_BUDGET_S = 5.0  # one periodic run stops starting new batches after this

_POINTS = MetricPoint._meta.db_table
_ROLLUPS = PointRollup._meta.db_table
_JOBS = Job._meta.db_table


def roll_up(job_id: int, most: int | None = None) -> int:
    """Add the job's points numbered above its watermark (at most `most`, default TFDASH_ROLLUP_BATCH) to its
    rollups, in one transaction; returns how far the watermark moved (0: nothing to add, no such job, or another run
    holds the job)."""
    most = settings.TFDASH_ROLLUP_BATCH if most is None else most
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [_LOCK_CLASS, job_id & 0x7FFF_FFFF])
        if not cursor.fetchone()[0]:
            return 0
        cursor.execute(f"SELECT points_rolled, points_seq FROM {_JOBS} WHERE id = %s", [job_id])  # noqa: S608
        row = cursor.fetchone()
        if row is None:
            return 0
        rolled, top = row
        upto = min(top, rolled + most)
        if upto <= rolled:
            return 0
        cursor.execute(_ROLL_SQL, [job_id, rolled, upto])
        cursor.execute(f"UPDATE {_JOBS} SET points_rolled = %s WHERE id = %s", [upto, job_id])  # noqa: S608
    return upto - rolled


def roll_up_due(budget_s: float = RUN_BUDGET_S) -> int:
    """One periodic run: every job with TFDASH_ROLLUP_AFTER_POINTS points above its watermark, batch after batch,
    until none is due or `budget_s` passed (the rest waits for the next run). Returns the points rolled up."""
    deadline = time.monotonic() + budget_s
    due = (
        Job.objects.filter(points_seq__gte=F("points_rolled") + settings.TFDASH_ROLLUP_AFTER_POINTS)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    done = 0
    for job_id in due:
        while time.monotonic() < deadline:
            moved = roll_up(job_id)
            done += moved
            if moved < settings.TFDASH_ROLLUP_BATCH:
                break
        if time.monotonic() >= deadline:
            break
    if done:
        log.info("rolled up %d metric points", done)
    return done


def rolled_to(job_id: int) -> int:
    """The job's watermark: every point numbered up to it is in its rollups (0: none rolled up, or no such job)."""
    return Job.objects.filter(pk=job_id).values_list("points_rolled", flat=True).first() or 0


def level_for(first_step: int, last_step: int, buckets: int) -> int | None:
    """The coarsest level whose blocks are no wider than one of `buckets` buckets over the series' steps; None when
    even the finest is wider (a series that short is read point by point: fewer than 16 points per bucket)."""
    width = (last_step - first_step + 1) / buckets
    fitting = [level for level in LEVELS if 2**level <= width]
    return fitting[-1] if fitting else None


def series(job_id: int) -> list[tuple[Any, ...]]:
    """Per series in the job's rollups: (task, phase, name, count, first step, last step), counted at one level."""
    with connection.cursor() as cursor:
        cursor.execute(_SERIES_SQL, [job_id])
        return cursor.fetchall()


# Each point goes into one block per level (`>>` rounds down, negative steps too); values come from the points table
# (the job's, numbered in the window); table names are the models'.
_ROLL_SQL = f"""
    INSERT INTO {_ROLLUPS} AS r (job_id, task_id, phase, name, level, block, count, first_step, last_step, low, high)
    SELECT p.job_id, p.task_id, p.phase, p.name, l.level, p.step >> l.level, count(*), min(p.step), max(p.step),
           min(ARRAY[p.value, p.step, p.seq, coalesce(p.epoch, -1), p.ts]),
           max(ARRAY[p.value, p.step, p.seq, coalesce(p.epoch, -1), p.ts])
    FROM {_POINTS} p CROSS JOIN unnest(ARRAY{list(LEVELS)}::smallint[]) AS l(level)
    WHERE p.job_id = %s AND p.seq > %s AND p.seq <= %s
    GROUP BY p.job_id, p.task_id, p.phase, p.name, l.level, p.step >> l.level
    ON CONFLICT (job_id, level, task_id, phase, name, block) DO UPDATE SET
        count = r.count + EXCLUDED.count,
        first_step = least(r.first_step, EXCLUDED.first_step),
        last_step = greatest(r.last_step, EXCLUDED.last_step),
        low = least(r.low, EXCLUDED.low),
        high = greatest(r.high, EXCLUDED.high)
"""  # noqa: S608
_SERIES_SQL = f"""
    SELECT task_id, phase, name, sum(count), min(first_step), max(last_step)
    FROM {_ROLLUPS} WHERE job_id = %s AND level = {LEVELS[-1]} GROUP BY task_id, phase, name
"""  # noqa: S608
# For history.thinned: large series' blocks at each one's level (from the rollups, a range of the unique index per
# series: LATERAL, and OFFSET 0 keeps the planner from flattening it into a scan of every level of the job) and the
# job's points above the watermark (the tail, by the (job, seq) index), each as a (step, lowest, highest) row,
# bucketed together. Grouped by the series' ordinal and its bucket, two integers: a hash aggregate; grouping by the
# series' text columns sorted every row by collation (25,000 rows at 100 k points per series: 90 ms against 37 ms).
# Parameters (named): the series' columns task, phase, name, lo (first step), hi (last step), level; job, rolled
# (the watermark), top, buckets.
BUCKETS_SQL = f"""
    WITH s AS (
        SELECT * FROM unnest(%(task)s::bigint[], %(phase)s::varchar[], %(name)s::varchar[], %(lo)s::bigint[],
                             %(hi)s::bigint[], %(level)s::smallint[]) WITH ORDINALITY
            AS s(task_id, phase, name, lo, hi, level, k)
    ), x AS (
        SELECT s.k, width_bucket(r.step, s.lo, s.hi + 1, %(buckets)s) AS bucket, r.low, r.high
        FROM s CROSS JOIN LATERAL (
            SELECT first_step AS step, low, high FROM {_ROLLUPS}
            WHERE job_id = %(job)s AND level = s.level AND task_id = s.task_id AND phase = s.phase AND name = s.name
            OFFSET 0
        ) r
        UNION ALL
        SELECT s.k, width_bucket(p.step, s.lo, s.hi + 1, %(buckets)s),
               ARRAY[p.value, p.step, p.seq, coalesce(p.epoch, -1), p.ts],
               ARRAY[p.value, p.step, p.seq, coalesce(p.epoch, -1), p.ts]
        FROM {_POINTS} p JOIN s USING (task_id, phase, name)
        WHERE p.job_id = %(job)s AND p.seq > %(rolled)s AND p.seq <= %(top)s
    )
    SELECT s.task_id, s.phase, s.name, g.low, g.high
    FROM (SELECT k, min(low) AS low, max(high) AS high FROM x GROUP BY k, bucket) g JOIN s USING (k)
"""  # noqa: S608
