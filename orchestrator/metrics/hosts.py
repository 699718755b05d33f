"""A job's host load: which hosts' CPU, memory and GPU samples belong to a job, and over which time.

One series per host that ran a task of the job (a task with a `started_at`: it had a process), over that host's
window: from its first task's start to its last task's end (now, while one is still active), widened by
WINDOW_MARGIN_S on both sides so a job shorter than the agent's sampling interval still has samples around it. The
nearest sample before the window and the nearest after it are included too: however short the job and however
slow the agent samples (`--sample-interval` up to 60 s), a host that sampled at all draws a line across the job.

The same windows decide which pages a fresh sample is pushed to live (`jobs_watching`): every job with an active
task on the host, or one that ended there less than WINDOW_MARGIN_S ago (the job's closing samples still go live).
The page gets the stored samples once on connect (`job_samples`), `GET /api/jobs/<id>/hosts/` returns the same.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q

from contracts.host_samples import readable_gpus
from orchestrator.models import ACTIVE_TASK_STATES, HostSample, Task

WINDOW_MARGIN_S = 5.0
MAX_SAMPLES_PER_HOST = 3600  # a longer window is thinned evenly to about this many (the page keeps as many)
SAMPLE_FIELDS = ("ts", "cpu_percent", "memory_used_mb", "memory_total_mb", "gpus")


@dataclass(frozen=True)
class HostWindow:
    host_id: int
    host: str
    start: float  # wall seconds, margin included
    end: float | None  # None: a task still runs there (the window is open)

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "start": self.start, "end": self.end}


def _seconds(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def job_windows(job_id: int) -> list[HostWindow]:
    """Each host that ran a task of the job (any placement), with its window, by host name."""
    spans: dict[int, list[Any]] = {}  # host id -> [name, first start, last end or None]
    rows = (
        Task.objects.filter(job_id=job_id, host__isnull=False, started_at__isnull=False)
        .values_list("host_id", "host__name", "started_at", "finished_at", "state", "job__finished_at")
        .order_by("started_at")
    )
    for host_id, name, started_at, finished_at, state, job_finished_at in rows:
        start = _seconds(started_at)
        # A final task without an end time (ended by a path that did not stamp it) ends with its job at the latest.
        end = None if state in ACTIVE_TASK_STATES else _seconds(finished_at or job_finished_at) or start
        span = spans.setdefault(host_id, [name, start, end])
        span[1] = min(span[1], start)
        if span[2] is not None:
            span[2] = None if end is None else max(span[2], end)
    return sorted(
        (
            HostWindow(
                host_id,
                name,
                start - WINDOW_MARGIN_S,
                None if end is None else end + WINDOW_MARGIN_S,
            )
            for host_id, (name, start, end) in spans.items()
        ),
        key=lambda w: w.host,
    )


def sample_dict(host: str, sample: HostSample | dict[str, Any]) -> dict[str, Any]:
    """One sample as frames and the API carry it. Its GPU entries as `readable_gpus` leaves them: a row stored
    before the ingest checked samples may hold anything."""
    get = sample.get if isinstance(sample, dict) else lambda name: getattr(sample, name)
    return {"host": host, **{name: get(name) for name in SAMPLE_FIELDS}, "gpus": readable_gpus(get("gpus"))}


def window_samples(window: HostWindow, after: float | None = None) -> list[dict[str, Any]]:
    """The window's samples of its host in time order (thinned to about MAX_SAMPLES_PER_HOST), with the nearest one
    on each side of the window; only those later than `after` when given."""
    samples = HostSample.objects.filter(host_id=window.host_id)
    inside = samples.filter(ts__gte=window.start)
    if window.end is not None:
        inside = inside.filter(ts__lte=window.end)
    stamps = list(inside.order_by("ts").values_list("ts", flat=True))
    if len(stamps) > MAX_SAMPLES_PER_HOST:  # evenly thinned, the last one kept (a live chart continues from it)
        stride = -(-len(stamps) // MAX_SAMPLES_PER_HOST)
        stamps = stamps[::stride] + ([stamps[-1]] if (len(stamps) - 1) % stride else [])
    before = samples.filter(ts__lt=window.start).order_by("-ts").values_list("ts", flat=True).first()
    wanted = ([before] if before is not None else []) + stamps
    if window.end is not None:
        later = samples.filter(ts__gt=window.end).order_by("ts").values_list("ts", flat=True).first()
        wanted += [later] if later is not None else []
    if after is not None:
        wanted = [ts for ts in wanted if ts > after]
    if not wanted:
        return []
    rows = samples.filter(ts__in=wanted).order_by("ts").values(*SAMPLE_FIELDS)
    return [sample_dict(window.host, row) for row in rows]


def job_samples(job_id: int, after: float | None = None) -> tuple[list[HostWindow], list[dict[str, Any]]]:
    """The job's host windows and all their samples (later than `after`), host by host, each in time order."""
    windows = job_windows(job_id)
    return windows, [sample for window in windows for sample in window_samples(window, after)]


def jobs_watching(host_ids: list[int], now: float | None = None) -> dict[int, set[int]]:
    """Host id -> the jobs whose pages show that host's fresh samples: a task there that started and is still active,
    or one that ended less than WINDOW_MARGIN_S ago."""
    now = time.time() if now is None else now
    ended_since = datetime.fromtimestamp(now - WINDOW_MARGIN_S).astimezone()
    # A task that never started (no process yet, or none ever) does not put its host on the job's page.
    tasks = Task.objects.filter(host_id__in=host_ids, started_at__isnull=False).filter(
        Q(state__in=ACTIVE_TASK_STATES) | Q(finished_at__gte=ended_since)
    )
    watching: dict[int, set[int]] = defaultdict(set)
    for host_id, job_id in tasks.values_list("host_id", "job_id"):
        watching[host_id].add(job_id)
    return watching


__all__ = ["HostWindow", "job_samples", "job_windows", "jobs_watching", "sample_dict", "window_samples"]
