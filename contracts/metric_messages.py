"""The metric traffic an agent forwards (entries of its host's METRICS stream, contracts/protocol.py): host samples
(`HostSampleBatch`), a task's metric events (`TaskMetricsBatch`), its artifacts (`TaskArtifact`), and the
backpressure that thins step-level points while the ingest is behind (`SHED_BACKLOG`, `shed_step_points`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HostSampleBatch:
    """Host samples (kind of CPU/memory/GPU readings, one dict per sample):
    {"ts": wall seconds, "cpu_percent": float, "memory_used_mb": int, "memory_total_mb": int, "gpu_error": str,
     "gpus": [{"index": int, "name": str, "utilization_percent": float, "memory_used_mb": int,
               "memory_total_mb": int, "temperature_c": float | None, "power_w": float | None,
               "processes": [{"pid": int, "used_memory_mb": int | None}]}]}"""

    samples: list[dict[str, Any]]


@dataclass(frozen=True)
class TaskMetricsBatch:
    task_id: int
    attempt: int
    events: list[dict[str, Any]]  # the process's JSON objects, as written (kinds "metric" and "facts")
    # Step-level points the agent left out of this task attempt's reports so far (SHED_BACKLOG): a running total, so
    # a report lost, late or delivered twice still leaves the right count (the ingest keeps the highest).
    shed: int = 0
    # What the agent dropped of this task attempt's output for its bounds (contracts/publish_limits.py), running
    # totals: "artifacts", "artifact_bytes", "metric_lines".
    dropped: dict[str, int] | None = None


# Backpressure: while its metrics stream holds this many entries the ingest has not stored yet, an agent sends only
# every SHED_STRIDE-th step of a task's "metric" events (every epoch end and every facts object still go), counting
# the points it left out (TaskMetricsBatch.shed). A hundredth of STREAM_MAXLEN: a stopped ingest makes agents thin
# their traffic long before Redis would trim unread entries, and a merely slow one never does (at full fleet rate
# one ingest partition that fell behind was about 11 entries per host behind: docs/sizing.md).
SHED_BACKLOG = 2_000
SHED_STRIDE = 10


def shed_step_points(events: list[Any]) -> tuple[list[Any], int]:
    """The events an agent still sends while its stream is backed up, and how many points it left out (one per
    metric value of a dropped event). Kept: anything that is not a step-level "metric" event (facts, epoch ends),
    and metric events on every SHED_STRIDE-th step."""
    kept: list[Any] = []
    shed = 0
    for event in events:
        step = event.get("step") if isinstance(event, dict) else None
        if (
            isinstance(event, dict)
            and event.get("kind") == "metric"
            and event.get("phase") != "epoch_end"
            and type(step) is int
            and step % SHED_STRIDE != 0
        ):
            metrics = event.get("metrics")
            shed += len(metrics) if isinstance(metrics, dict) else 1
            continue
        kept.append(event)
    return kept, shed


@dataclass(frozen=True)
class TaskArtifact:
    task_id: int
    attempt: int
    name: str
    sha256: str
    content_b64: str
    # In the object store instead (content_b64 empty): uploaded to artifact slot `slot` of the task attempt
    # (contracts/store.py artifact_key), `size` bytes. -1: the content travels inline.
    size: int = 0
    slot: int = -1
