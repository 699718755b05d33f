"""Rollups: a long job's page is drawn from blocks of its series plus the points above their watermark, and shows
what reading every point would (the extremes, the tail, the short series whole); rolling up counts every point once
however runs overlap; only jobs past the threshold are rolled up; the rollups go with their job."""

from __future__ import annotations

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from config.celery import app
from orchestrator import tasks  # noqa: F401  (registers the Celery entry points)
from orchestrator.metrics import history, rollups
from orchestrator.models import Job, MetricPoint, PointRollup, Task

pytestmark = pytest.mark.django_db(transaction=True)

LONG = 40_000  # steps of the long series: level 4 (16-step blocks) fits its 1,000 buckets


def add_points(job: Job, task: Task, steps: range, *, spike_at: int | None = None, name: str = "loss") -> None:
    """Train points of `name` for `steps` (value 1/step, and 100.0 at `spike_at`), numbered like the ingest's."""
    value = {step: 1.0 / step for step in steps} | ({spike_at: 100.0} if spike_at else {})
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, task=task, phase="train", name=name, step=step, epoch=1, value=value[step], ts=1.0)
        for step in steps
    )


def series_of(points: list[list], name: str, phase: str = "train") -> list[list]:
    return [p for p in points if p[3] == name and p[2] == phase]


def test_a_long_series_drawn_from_rollups_keeps_the_extremes_the_tail_and_the_short_series(running):
    _owner, _host, _token, job, task = running
    add_points(job, task, range(1, LONG + 1), spike_at=12_345)
    MetricPoint.objects.bulk_create(  # a short series beside it: one epoch_end point per 1,000 steps
        MetricPoint(job=job, task=task, phase="epoch_end", name="loss", step=s, epoch=s // 1000, value=1.0 / s, ts=1.0)
        for s in range(1000, LONG + 1, 1000)
    )
    with override_settings(TFDASH_ROLLUP_AFTER_POINTS=1000):
        assert rollups.roll_up_due() == LONG + LONG // 1000
    job.refresh_from_db()
    assert job.points_rolled == job.points_seq
    add_points(job, task, range(LONG + 1, LONG + 3001), spike_at=LONG + 2000)  # the tail, not rolled up yet

    points, cursor, thinned = history.thinned(job.pk)

    job.refresh_from_db()
    assert cursor == job.points_seq and thinned
    loss = series_of(points, "loss")
    assert history.SERIES_POINTS // 2 <= len(loss) <= history.SERIES_POINTS  # drawn thinned, not from 43,000 points
    stored = {seq: (step, value) for seq, step, value in MetricPoint.objects.filter(job=job).values_list(
        "seq", "step", "value")}  # fmt: skip
    assert all(stored[p[0]] == (p[4], p[6]) for p in points)  # every point drawn is a stored point, whole
    values = {p[4]: p[6] for p in loss}
    assert values[12_345] == 100.0 and values[LONG + 2000] == 100.0  # a spike in the rollups and one in the tail
    assert values[LONG + 3000] == pytest.approx(1.0 / (LONG + 3000))  # the lowest point of the last bucket
    assert 1 in values  # the first step's value (the highest of the first bucket)
    assert [p[4] for p in series_of(points, "loss", "epoch_end")] == list(range(1000, LONG + 1, 1000))  # whole
    assert [p[0] for p in points] == sorted(p[0] for p in points)


def test_a_series_too_short_for_any_level_is_drawn_from_its_points(running):
    _owner, _host, _token, job, task = running
    add_points(job, task, range(1, 8001), spike_at=4321)  # 8,000 steps: 8 per bucket, finer than the 16-step blocks
    with override_settings(TFDASH_ROLLUP_AFTER_POINTS=1000):
        rollups.roll_up_due()

    points, _cursor, thinned = history.thinned(job.pk)

    assert thinned and rollups.level_for(1, 8000, 1000) is None
    loss = series_of(points, "loss")
    assert len(loss) == history.SERIES_POINTS  # the lowest and the highest of each 8-step bucket
    assert {p[4]: p[6] for p in loss}[4321] == 100.0


def test_rolling_up_in_batches_and_overlapping_runs_counts_every_point_once(running):
    _owner, _host, _token, job, task = running
    add_points(job, task, range(1, 10_001))
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s, %s)", [rollups._LOCK_CLASS, job.pk])
        assert rollups.roll_up(job.pk) == 0  # another run holds the job: this one adds nothing
        other.execute("SELECT pg_advisory_unlock(%s, %s)", [rollups._LOCK_CLASS, job.pk])
    moved = [rollups.roll_up(job.pk, most=3000) for _ in range(5)]

    assert moved == [3000, 3000, 3000, 1000, 0]
    for level in rollups.LEVELS:
        blocks = PointRollup.objects.filter(job=job, level=level)
        assert sum(blocks.values_list("count", flat=True)) == 10_000
        assert blocks.count() == len({step >> level for step in range(1, 10_001)})
    first = PointRollup.objects.get(job=job, level=4, block=0)  # steps 1-15
    assert (first.count, first.first_step, first.last_step) == (15, 1, 15)
    assert (first.high[:2], first.low[:2]) == ([1.0, 1.0], [1.0 / 15, 15.0])


def test_only_jobs_past_the_threshold_are_rolled_up_and_their_rollups_go_with_them(running):
    owner, _host, _token, job, task = running
    quiet = Job.objects.create(owner=owner, cluster=job.cluster, name="q", strategy="mirrored", program_kind="script")
    quiet_task = Task.objects.create(job=quiet, attempt=1, type="worker", index=0, host=task.host, state="running")
    add_points(job, task, range(1, 3001))
    add_points(quiet, quiet_task, range(1, 101))

    with override_settings(TFDASH_ROLLUP_AFTER_POINTS=1000):
        rollups.roll_up_due()

    assert Job.objects.get(pk=job.pk).points_rolled == 3000
    assert Job.objects.get(pk=quiet.pk).points_rolled == 0
    assert not PointRollup.objects.filter(job=quiet).exists()
    job.delete()
    assert not PointRollup.objects.exists()
    assert (
        settings.CELERY_BEAT_SCHEDULE["rollups"]["task"] == "orchestrator.rollups"
        and "orchestrator.rollups" in app.tasks
    )
