"""What TF processes report through their agents: metric points, facts and artifacts, stored idempotently."""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import math
import re
from typing import Any

from django.db import transaction

from orchestrator import agents, counters, live
from orchestrator.models import ACTIVE_TASK_STATES, HostSample, Job, JobArtifact, MetricPoint, Task, TaskType
from worker_agent.protocol import MAX_ARTIFACT_BYTES, HostSampleBatch, TaskArtifact, TaskMetricsBatch

log = logging.getLogger(__name__)

DROPPED = "metric_events_dropped"
MAX_EVENTS_PER_BATCH = 5000
_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,64}$")
_ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


def _task_of(payload: Any, body_type: type) -> tuple[Task, Any] | None:
    found = agents.authenticated_body(payload, body_type)
    if found is None:
        return None
    host, body = found
    task = Task.objects.filter(pk=body.task_id, attempt=body.attempt, host=host).select_related("job").first()
    if task is None:
        counters.incr(DROPPED)
        return None
    return task, body


def metric_rows(task: Task, events: list[Any]) -> tuple[list[MetricPoint], dict[str, Any] | None]:
    """Rows for every finite numeric value in the batch's metric events, and the last facts object in it."""
    rows: list[MetricPoint] = []
    facts = None
    for event in events[:MAX_EVENTS_PER_BATCH]:
        if not isinstance(event, dict):
            continue
        if event.get("kind") == "facts" and isinstance(event.get("facts"), dict):
            facts = event["facts"]
            continue
        if event.get("kind") != "metric" or not isinstance(event.get("metrics"), dict):
            continue
        try:
            step = int(event["step"])
            ts = float(event["ts"])
            epoch = None if event.get("epoch") is None else int(event["epoch"])
        except (KeyError, TypeError, ValueError):
            counters.incr(DROPPED)
            continue
        phase = str(event.get("phase") or "custom")[:10]
        for name, value in event["metrics"].items():
            if not (isinstance(name, str) and _NAME.match(name)) or isinstance(value, bool):
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                rows.append(
                    MetricPoint(
                        job_id=task.job_id,
                        task=task,
                        phase=phase,
                        name=name,
                        step=step,
                        epoch=epoch,
                        value=float(value),
                        ts=ts,
                    )
                )
    return rows, facts


def handle_task_metrics(payload: Any) -> int:
    found = _task_of(payload, TaskMetricsBatch)
    if found is None:
        return 0
    task, batch = found
    rows, facts = metric_rows(task, batch.events if isinstance(batch.events, list) else [])
    with transaction.atomic():
        if rows:
            # An upsert, not "ignore": a redelivered batch is stored once AND gets its ids back, so its frame
            # carries the same ids and a browser drops the duplicates.
            MetricPoint.objects.bulk_create(
                rows,
                update_conflicts=True,
                unique_fields=["task", "phase", "name", "step"],
                update_fields=["value", "ts", "epoch"],
                batch_size=1000,
            )
        if facts is not None:
            Task.objects.filter(pk=task.pk).update(facts=facts)
            if (task.type, task.index) in ((TaskType.CHIEF, 0), (TaskType.WORKER, 0)) and _speaks_for_job(task):
                Job.objects.filter(pk=task.job_id).update(facts=facts)
    if rows:
        points = [[r.pk, task.pk, r.phase, r.name, r.step, r.epoch, r.value, r.ts] for r in rows]
        live.publish(task.job_id, {"type": "metrics", "points": points, "cursor": max(p[0] for p in points)})
    if facts is not None:
        live.publish(task.job_id, {"type": "facts", "task": task.pk, "facts": facts})
    return len(rows)


def handle_host_samples(payload: Any) -> int:
    found = agents.authenticated_body(payload, HostSampleBatch)
    if found is None:
        return 0
    host, batch = found
    rows = []
    for sample in batch.samples[:MAX_EVENTS_PER_BATCH] if isinstance(batch.samples, list) else []:
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
    HostSample.objects.bulk_create(rows, ignore_conflicts=True)
    if rows:
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
        for job_id in set(
            Task.objects.filter(host=host, state__in=ACTIVE_TASK_STATES).values_list("job_id", flat=True)
        ):
            live.publish(job_id, frame)
    return len(rows)


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


def _speaks_for_job(task: Task) -> bool:
    """The chief speaks for a ParameterServer job; worker 0 for the others."""
    has_chief = task.job.strategy == "parameter_server"
    return task.type == (TaskType.CHIEF if has_chief else TaskType.WORKER)


def handle_task_artifact(payload: Any) -> JobArtifact | None:
    found = _task_of(payload, TaskArtifact)
    if found is None:
        return None
    task, artifact = found
    if not _ARTIFACT_NAME.match(str(artifact.name)):
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
