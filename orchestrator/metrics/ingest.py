"""What TF processes report through their agents: metric points, facts, host samples and artifacts, stored
idempotently, in bulk.

`store_reports` takes what the metrics stream consumer drained (often hundreds of reports) and stores every point and
sample of it in one transaction, then pushes one frame per job. Reports are authenticated one by one, against cached
hosts (for a few seconds) and tasks: reading them per report was most of a small report's cost (measured: 1.5 to
3.9 ms to authenticate, plus the task lookup, for about 8 ms a one-point message).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, connection, transaction

from contracts.limits import MAX_ARTIFACT_BYTES
from contracts.names import METRIC_NAME, artifact_name_problem
from contracts.protocol import (
    HOST_SAMPLES,
    TASK_ARTIFACT,
    TASK_METRICS,
    HostSampleBatch,
    TaskArtifact,
    TaskMetricsBatch,
)
from contracts.strategies import speaks_for_job
from orchestrator import counters
from orchestrator.agents import auth
from orchestrator.metrics import live
from orchestrator.models import ACTIVE_TASK_STATES, Host, HostSample, Job, JobArtifact, MetricPoint, Task

log = logging.getLogger(__name__)

DROPPED = "metric_events_dropped"
MAX_EVENTS_PER_BATCH = 5000
# A rotated token or a deleted host takes effect for the ingest within this long.
HOST_CACHE_S = 5.0
MAX_CACHED_TASKS = 20_000


class _Lookups:
    """Hosts by name (briefly, token changes must take effect) and tasks by id (what the ingest checks never changes
    on a task row: job, attempt, host, type, index)."""

    def __init__(self) -> None:
        self.hosts: dict[str, tuple[float, Host | None]] = {}
        self.tasks: dict[int, Task | None] = {}

    def host(self, name: str, token: str) -> Host | None:
        """The host called `name` if `token` is its token. A cached host whose token does not match is read again:
        a new token works at once; the replaced one keeps working for at most HOST_CACHE_S."""
        now = time.monotonic()
        hit = self.hosts.get(name)
        if hit is not None and hit[0] > now and hit[1] is not None and hit[1].check_token(token):
            return hit[1]
        if hit is not None and hit[0] > now and hit[1] is None:
            return None  # an unknown name, seen lately: a flood of forged reports does not reach the database
        if len(self.hosts) > 10_000:  # names from forged reports must not grow this without bound
            self.hosts.clear()
        host = Host.objects.filter(name=name).first()
        self.hosts[name] = (now + HOST_CACHE_S, host)
        return host if host is not None and host.check_token(token) else None

    def task(self, task_id: int) -> Task | None:
        if task_id not in self.tasks:
            if len(self.tasks) >= MAX_CACHED_TASKS:
                self.tasks.clear()
            self.tasks[task_id] = Task.objects.filter(pk=task_id).select_related("job").first()
        return self.tasks[task_id]

    def forget(self) -> None:
        self.hosts.clear()
        self.tasks.clear()


lookups = _Lookups()


def _task_of(payload: Any, body_type: type) -> tuple[Task, Any] | None:
    found = auth.authenticated_body(payload, body_type, lookups.host)
    if found is None:
        return None
    host, body = found
    task = lookups.task(body.task_id) if isinstance(body.task_id, int) else None
    if task is None or task.attempt != body.attempt or task.host_id != host.pk:
        counters.incr(DROPPED)
        return None
    return task, body


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
        for name, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not _valid_name(name):
                continue
            value = float(value)
            if math.isfinite(value):
                rows.append((job_id, task_id, phase, name, step, epoch, value, ts))
    return rows, facts


@dataclass
class Stored:
    points: int = 0
    samples: int = 0
    artifacts: int = 0
    dropped: int = 0


@dataclass
class _Batch:
    points: list[PointRow] = field(default_factory=list)
    facts: dict[int, tuple[Task, dict[str, Any]]] = field(default_factory=dict)
    samples: dict[int, tuple[Host, list[HostSample]]] = field(default_factory=dict)
    stored_points: dict[int, list[list[Any]]] = field(default_factory=dict)  # per job, once written

    @classmethod
    def empty(cls) -> _Batch:
        return cls()


def store_reports(reports: Iterable[tuple[str, Any]]) -> Stored:
    """Store a drained run of agent reports (name, envelope): every point and sample in one transaction, then one
    live frame per job. An artifact is stored on its own (it can be large). A report that cannot be trusted or read is
    dropped and counted; one whose rows the database refuses (its task deleted meanwhile) is dropped alone."""
    reports = list(reports)
    stored = Stored()
    batch = _Batch.empty()
    artifacts = []
    for name, payload in reports:
        if name == TASK_METRICS:
            stored.dropped += not _collect_metrics(payload, batch)
        elif name == HOST_SAMPLES:
            stored.dropped += not _collect_samples(payload, batch)
        elif name == TASK_ARTIFACT:
            artifacts.append(payload)
        else:
            log.warning("dropped a report of unknown kind %r", str(name)[:100])
            counters.incr(auth.MALFORMED)
            stored.dropped += 1
    try:
        with transaction.atomic():
            _write(batch)
    except (IntegrityError, DataError):
        # Rare: a task or host deleted between lookup and insert. Store report by report, dropping the bad ones.
        lookups.forget()
        return _store_one_by_one(reports, artifacts, stored)
    stored.points += sum(len(points) for points in batch.stored_points.values())
    stored.samples += sum(len(rows) for _host, rows in batch.samples.values())
    _publish(batch)
    for payload in artifacts:
        stored.artifacts += handle_task_artifact(payload) is not None
    return stored


def _store_one_by_one(reports: list[tuple[str, Any]], artifacts: list[Any], stored: Stored) -> Stored:
    for name, payload in reports:
        if name == TASK_ARTIFACT:
            continue
        single = _Batch.empty()
        if not (_collect_metrics(payload, single) if name == TASK_METRICS else _collect_samples(payload, single)):
            continue
        try:
            with transaction.atomic():
                _write(single)
        except (IntegrityError, DataError) as exc:
            log.warning("dropped a %s report the database refused: %s", name, exc)
            counters.incr(DROPPED)
            stored.dropped += 1
            continue
        stored.points += sum(len(points) for points in single.stored_points.values())
        stored.samples += sum(len(rows) for _host, rows in single.samples.values())
        _publish(single)
    for payload in artifacts:
        stored.artifacts += handle_task_artifact(payload) is not None
    return stored


def _collect_metrics(payload: Any, batch: _Batch) -> bool:
    found = _task_of(payload, TaskMetricsBatch)
    if found is None:
        return False
    task, body = found
    rows, facts = metric_rows(task, body.events if isinstance(body.events, list) else [])
    batch.points.extend(rows)
    if facts is not None:
        batch.facts[task.pk] = (task, facts)
    return True


def _collect_samples(payload: Any, batch: _Batch) -> bool:
    found = auth.authenticated_body(payload, HostSampleBatch, lookups.host)
    if found is None:
        return False
    host, body = found
    rows = batch.samples.setdefault(host.pk, (host, []))[1]
    for sample in body.samples[:MAX_EVENTS_PER_BATCH] if isinstance(body.samples, list) else []:
        try:
            rows.append(
                HostSample(
                    host=host,
                    ts=float(sample["ts"]),
                    cpu_percent=_maybe_float(sample.get("cpu_percent")),
                    memory_used_mb=_maybe_int(sample.get("memory_used_mb")),
                    memory_total_mb=_maybe_int(sample.get("memory_total_mb")),
                    gpus=sample.get("gpus") if isinstance(sample.get("gpus"), list) else [],
                )
            )
        except (KeyError, TypeError, ValueError):
            counters.incr(DROPPED)
    return True


def _write(batch: _Batch) -> None:
    if batch.points:
        batch.stored_points = _upsert_points(batch.points)
    for task, facts in batch.facts.values():
        Task.objects.filter(pk=task.pk).update(facts=facts)
        if (task.type, task.index) == speaks_for_job(task.job.strategy):  # the task whose exit decides the job
            Job.objects.filter(pk=task.job_id).update(facts=facts)
    rows = [row for _host, host_rows in batch.samples.values() for row in host_rows]
    if rows:
        HostSample.objects.bulk_create(rows, ignore_conflicts=True)


def _upsert_points(rows: list[PointRow]) -> dict[int, list[list[Any]]]:
    """Store `rows` idempotently; returns the stored points per job, as POINT_COLUMNS lists in id order.

    An upsert, not "ignore": a redelivered point is stored once AND gets its id back, so its frame carries the same id
    and a browser drops the duplicate. One row per (task, phase, name, step): the same key twice in one upsert is an
    error, and the later value is the one to keep (it is what a redelivery would leave too).
    """
    unique = list({(r[1], r[2], r[3], r[4]): r for r in rows}.values())
    if connection.vendor == "postgresql":
        # One statement over column arrays: no model instance and no SQL compiled per row (that was ~80% of the
        # time with bulk_create: measured 7,400 points/s in-process, profiled).
        with connection.cursor() as cursor:
            cursor.execute(_UPSERT_SQL, [list(column) for column in zip(*unique, strict=True)])
            ids = {(task, phase, name, step): pk for pk, task, phase, name, step in cursor.fetchall()}
    else:
        objects = [
            MetricPoint(job_id=j, task_id=t, phase=ph, name=n, step=st, epoch=ep, value=v, ts=ts)
            for j, t, ph, n, st, ep, v, ts in unique
        ]
        MetricPoint.objects.bulk_create(
            objects,
            update_conflicts=True,
            unique_fields=["task", "phase", "name", "step"],
            update_fields=["value", "ts", "epoch"],
            batch_size=2000,
        )
        ids = {(o.task_id, o.phase, o.name, o.step): o.pk for o in objects}
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


def _publish(batch: _Batch) -> None:
    """One metrics frame per job, in id order (pages drop ids at or below their cursor), then facts and host load."""
    for job_id, points in batch.stored_points.items():
        live.publish(job_id, {"type": "metrics", "points": points, "cursor": points[-1][0]})
    for task, facts in batch.facts.values():
        live.publish(task.job_id, {"type": "facts", "task": task.pk, "facts": facts})
    if not any(rows for _host, rows in batch.samples.values()):
        return
    watching: dict[int, set[int]] = defaultdict(set)  # host -> jobs with a live process there
    try:
        active = Task.objects.filter(host_id__in=batch.samples.keys(), state__in=ACTIVE_TASK_STATES)
        for host_id, job_id in active.values_list("host_id", "job_id"):
            watching[host_id].add(job_id)
    except DatabaseError as exc:  # the samples are stored; a page shows them on its next load
        log.warning("could not find the jobs watching hosts %s: %s", list(batch.samples), exc)
        return
    for host_id, (host, rows) in batch.samples.items():
        if not rows or not watching[host_id]:
            continue
        frame = {
            "type": "hosts",
            "samples": [
                {
                    "host": host.name,
                    "ts": r.ts,
                    "cpu_percent": r.cpu_percent,
                    "memory_used_mb": r.memory_used_mb,
                    "memory_total_mb": r.memory_total_mb,
                    "gpus": r.gpus,
                }
                for r in rows
            ],
        }
        # Every job with a process on this host shows the host's load.
        for job_id in watching[host_id]:
            live.publish(job_id, frame)


def handle_task_metrics(payload: Any) -> int:
    """One TASK_METRICS report on its own (tests, tools); the stream consumer stores many at once."""
    return store_reports([(TASK_METRICS, payload)]).points



def _maybe_float(value: Any) -> float | None:
    return (
        float(value)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        else None
    )


def _maybe_int(value: Any) -> int | None:
    return (
        int(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) else None
    )


def handle_task_artifact(payload: Any) -> JobArtifact | None:
    found = _task_of(payload, TaskArtifact)
    if found is None:
        return None
    task, artifact = found
    if artifact_name_problem(artifact.name):
        log.warning("artifact with a bad name %r from task %s dropped", artifact.name, task.pk)
        return None
    try:
        content = base64.b64decode(artifact.content_b64, validate=True)
    except (binascii.Error, ValueError, TypeError):
        log.warning("artifact %s of task %s is not base64", artifact.name, task.pk)
        return None
    if len(content) > MAX_ARTIFACT_BYTES or hashlib.sha256(content).hexdigest() != artifact.sha256:
        log.warning("artifact %s of task %s is too large or its hash does not match", artifact.name, task.pk)
        return None
    stored, _ = JobArtifact.objects.update_or_create(
        job_id=task.job_id,
        name=artifact.name,
        defaults={"task": task, "sha256": artifact.sha256, "size": len(content), "content": content},
    )
    return stored
