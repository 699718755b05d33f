"""A job's metric points (numbered per job in commit order: `number_points`) and their rollups, the summed blocks a
long job's page draws from (orchestrator/metrics/)."""

from __future__ import annotations

from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.db import connection, models, transaction

from orchestrator.models.jobs import Job, Task


def number_points(per_job: dict[int, int]) -> dict[int, int]:
    """Take `per_job[job]` numbers from each job's point counter (Job.points_seq; contracts/protocol.py POINT_SEQ) and
    return the first of each job's run; a job that does not exist gets none. Call inside a transaction: the jobs' rows
    stay locked until it commits (taken in id order, so two writers never wait on each other in a circle), so a job's
    numbers grow in commit order whoever writes its points."""
    jobs = sorted(per_job)
    if not jobs:
        return {}
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} WHERE id = ANY(%s) ORDER BY id FOR UPDATE", [jobs])  # noqa: S608
        cursor.execute(
            f"""UPDATE {table} j SET points_seq = j.points_seq + n.count
                FROM unnest(%s::bigint[], %s::bigint[]) AS n(id, count) WHERE j.id = n.id
                RETURNING j.id, j.points_seq""",  # noqa: S608 - the model's table; values are parameters
            [jobs, [per_job[job] for job in jobs]],
        )
        return {job: top - per_job[job] + 1 for job, top in cursor.fetchall()}


class PointQuerySet(models.QuerySet["MetricPoint"]):
    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[MetricPoint]:
        """Points made here (tools, tests; the ingest stores its own by COPY) are numbered like the ingest's."""
        objs = list(objs)
        with transaction.atomic(using=self.db):
            per_job: dict[int, int] = {}
            for point in objs:
                if not point.seq:
                    per_job[point.job_id] = per_job.get(point.job_id, 0) + 1
            first = number_points(per_job)
            for point in objs:
                if not point.seq and point.job_id in first:
                    point.seq = first[point.job_id]
                    first[point.job_id] += 1
            return super().bulk_create(objs, *args, **kwargs)


class MetricPoint(models.Model):
    """One value a task reported: idempotent on (task, phase, name, step), so a redelivered batch is stored once."""

    id = models.BigAutoField(primary_key=True)
    # No index of their own: (job, id) and the unique (task, phase, name, step) lead with them. No database
    # constraint: its check per row (a key-share lock on the task, deferred to the commit) was a quarter of the
    # ingest's database time (bench/pipeline.py). The ingest stores points only for a task it found, for its current
    # attempt (metrics/lookups.py), tasks are never deleted but with their cluster, and the ORM deletes their points
    # with them.
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="metric_points", db_index=False, db_constraint=False
    )
    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, related_name="metric_points", db_index=False, db_constraint=False
    )
    phase = models.CharField(max_length=10)  # train | epoch_end | custom
    name = models.CharField(max_length=64)
    step = models.BigIntegerField()
    epoch = models.IntegerField(null=True, blank=True)
    value = models.FloatField()
    ts = models.FloatField(help_text="wall-clock seconds when the TF process measured it")
    # Its number in its job, in commit order: the browser's resume cursor (contracts/protocol.py POINT_SEQ).
    seq = models.BigIntegerField(default=0)

    objects = PointQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["task", "phase", "name", "step"], name="metric_point_unique"),
        ]
        indexes = [models.Index(fields=["job", "seq"])]

    def __str__(self) -> str:
        return f"{self.task_id}:{self.name}@{self.step}={self.value}"


class PointRollup(models.Model):
    """A block of 2**level consecutive steps of one series (task, phase, name), summed up: how many points, the first
    and last step, and the points with the lowest and the highest value, whole. A long job's page draws a series from
    the coarsest level still finer than its chart's buckets instead of reading millions of points
    (orchestrator/metrics/rollups.py)."""

    id = models.BigAutoField(primary_key=True)
    # No database constraint, as for MetricPoint: the ORM deletes a job's rollups with it.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False)
    phase = models.CharField(max_length=10)
    name = models.CharField(max_length=64)
    level = models.SmallIntegerField(help_text="a block spans 2**level steps")
    block = models.BigIntegerField(help_text="step >> level (rounded down)")
    count = models.BigIntegerField()
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    # [value, step, seq, epoch (-1: none), ts] of the block's lowest and highest value (history.thinned's shape).
    low = ArrayField(models.FloatField())
    high = ArrayField(models.FloatField())

    class Meta:
        # Level before series: a read takes one level of a job's series (history.thinned), a range of this index.
        constraints = [
            models.UniqueConstraint(
                fields=["job", "level", "task", "phase", "name", "block"], name="point_rollup_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_id}:{self.name}@{self.level}#{self.block} ({self.count} points)"
