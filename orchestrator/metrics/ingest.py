"""What TF processes report through their agents: metric points, facts, log lines, host samples and artifacts, stored
idempotently, in bulk.

`store_reports` takes what the metrics stream consumer drained (often hundreds of reports) and stores every point and
sample of it in one transaction, then pushes one frame per job. Reports are authenticated one by one against cached
hosts and tasks (metrics/lookups.py); points are made and upserted in metrics/points.py, artifacts stored in
metrics/artifacts.py.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, transaction

from contracts.limits import MAX_LOG_LINE_CHARS
from contracts.protocol import (
    HOST_SAMPLES,
    TASK_ARTIFACT,
    TASK_LOGS,
    TASK_METRICS,
    HostSampleBatch,
    TaskLogBatch,
    TaskMetricsBatch,
)
from contracts.strategies import speaks_for_job
from orchestrator import counters
from orchestrator.agents import auth
from orchestrator.metrics import live
from orchestrator.metrics.artifacts import handle_task_artifact
from orchestrator.metrics.lookups import DROPPED, lookups, task_of
from orchestrator.metrics.points import MAX_EVENTS_PER_BATCH, PointRow, metric_rows, upsert_points
from orchestrator.models import ACTIVE_TASK_STATES, Host, HostSample, Job, Task, TaskLogLine

log = logging.getLogger(__name__)

MAX_LOG_LINES = 2000  # per report: an agent sends at most 200 (worker_agent/supervision/output.py)


@dataclass
class Stored:
    points: int = 0
    samples: int = 0
    artifacts: int = 0
    dropped: int = 0
    lines: int = 0


@dataclass
class _Batch:
    points: list[PointRow] = field(default_factory=list)
    facts: dict[int, tuple[Task, dict[str, Any]]] = field(default_factory=dict)
    samples: dict[int, tuple[Host, list[HostSample]]] = field(default_factory=dict)
    lines: list[TaskLogLine] = field(default_factory=list)
    log_jobs: set[int] = field(default_factory=set)
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
        if name in _COLLECTORS:
            stored.dropped += not _COLLECTORS[name](payload, batch)
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
    _stored(batch, stored)
    return _store_artifacts(artifacts, stored)


def _store_one_by_one(reports: list[tuple[str, Any]], artifacts: list[Any], stored: Stored) -> Stored:
    for name, payload in reports:
        if name == TASK_ARTIFACT:
            continue
        single = _Batch.empty()
        if name not in _COLLECTORS or not _COLLECTORS[name](payload, single):
            continue
        try:
            with transaction.atomic():
                _write(single)
        except (IntegrityError, DataError) as exc:
            log.warning("dropped a %s report the database refused: %s", name, exc)
            counters.incr(DROPPED)
            stored.dropped += 1
            continue
        _stored(single, stored)
    return _store_artifacts(artifacts, stored)


def _stored(batch: _Batch, stored: Stored) -> None:
    """A committed batch: counted, then pushed to the pages watching its jobs."""
    stored.points += sum(len(points) for points in batch.stored_points.values())
    stored.samples += sum(len(rows) for _host, rows in batch.samples.values())
    stored.lines += len(batch.lines)
    _publish(batch)


def _store_artifacts(artifacts: list[Any], stored: Stored) -> Stored:
    """Each artifact on its own (one can be large), after the points and samples of its run."""
    for payload in artifacts:
        stored.artifacts += handle_task_artifact(payload) is not None
    return stored


def _collect_metrics(payload: Any, batch: _Batch) -> bool:
    found = task_of(payload, TaskMetricsBatch)
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


def _collect_logs(payload: Any, batch: _Batch) -> bool:
    found = task_of(payload, TaskLogBatch)
    if found is None:
        return False
    task, body = found
    try:
        lines = [(int(seq), str(stream)[:6], str(text)[:MAX_LOG_LINE_CHARS]) for seq, stream, text in body.lines]
    except (TypeError, ValueError) as exc:
        log.warning("malformed log batch for task %s: %r", task.pk, exc)
        counters.incr(DROPPED)
        return False
    batch.lines.extend(
        TaskLogLine(task_id=task.pk, seq=seq, stream=stream, text=text) for seq, stream, text in lines[:MAX_LOG_LINES]
    )
    batch.log_jobs.add(task.job_id)
    return True


_COLLECTORS = {TASK_METRICS: _collect_metrics, HOST_SAMPLES: _collect_samples, TASK_LOGS: _collect_logs}


def _write(batch: _Batch) -> None:
    if batch.points:
        batch.stored_points = upsert_points(batch.points)
    for task, facts in batch.facts.values():
        Task.objects.filter(pk=task.pk).update(facts=facts)
        if (task.type, task.index) == speaks_for_job(task.job.strategy):  # the task whose exit decides the job
            Job.objects.filter(pk=task.job_id).update(facts=facts)
    rows = [row for _host, host_rows in batch.samples.values() for row in host_rows]
    if rows:
        HostSample.objects.bulk_create(rows, ignore_conflicts=True)
    if batch.lines:
        # A re-read entry carries the same (task, seq): stored once.
        TaskLogLine.objects.bulk_create(batch.lines, ignore_conflicts=True)


def _publish(batch: _Batch) -> None:
    """One metrics frame per job, in id order (pages drop ids at or below their cursor), then facts and host load."""
    for job_id, points in batch.stored_points.items():
        live.publish(job_id, {"type": "metrics", "points": points, "cursor": points[-1][0]})
    for task, facts in batch.facts.values():
        live.publish(task.job_id, {"type": "facts", "task": task.pk, "facts": facts})
    for job_id in batch.log_jobs:
        live.logs_stored(job_id)
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


def handle_task_logs(payload: Any) -> int:
    """One TASK_LOGS report on its own (tests, tools, and any sent through the orchestrator queue by an older agent)."""
    return store_reports([(TASK_LOGS, payload)]).lines


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
