"""What a finished (or running) job measured, read from its stored rows and metric points: per epoch its wall time,
elapsed time since the job's first task start and epoch-end metrics; the job's training throughput. One definition,
read by the side-by-side comparison of jobs (dashboard/compare.py) and by experiments (orchestrator/experiments/
summary.py).

Whose numbers: epoch-end metrics are those of the task that speaks for the job
(`contracts.strategies.speaks_for_job`: the chief of a ParameterServer job, worker 0 otherwise; the same task whose
facts become `Job.facts`). A job restarted from a checkpoint reports some epochs twice (once per placement); the later
placement's report of an epoch wins.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Avg

from contracts.strategies import speaks_for_job
from orchestrator.models import Job, MetricPoint, Task

# Epoch-end metrics compared (tables and charts), in this order, when any compared job reported them.
METRICS = ("loss", "accuracy", "val_loss", "val_accuracy")


@dataclass(frozen=True)
class Epoch:
    number: int
    wall_s: float | None  # how long the epoch took (the runtime's epoch_time_s, else the gap between epoch ends)
    elapsed_s: float | None  # seconds from the job's first task start to this epoch's end (the wall-time axis)
    values: dict[str, float]  # the speaking task's epoch-end metrics (loss, accuracy, val_*, learning_rate, ...)


@dataclass(frozen=True)
class JobRun:
    job: Job
    speaker: str  # "worker 0" / "chief 0": whose epoch-end metrics these are
    epochs: list[Epoch]
    examples_per_s: float | None  # the job's training throughput (see `_throughput`)
    run_s: float | None  # first task start to job end

    @property
    def final(self) -> dict[str, float]:
        return self.epochs[-1].values if self.epochs else {}

    @property
    def mean_epoch_s(self) -> float | None:
        walls = [e.wall_s for e in self.epochs if e.wall_s is not None]
        return sum(walls) / len(walls) if walls else None


def load_runs(jobs: list[Job]) -> list[JobRun]:
    """One JobRun per job, in the order given."""
    tasks = list(Task.objects.filter(job__in=jobs).only("pk", "job_id", "type", "index", "attempt", "started_at"))
    tasks_of: dict[int, list[Task]] = defaultdict(list)
    for task in tasks:
        tasks_of[task.job_id].append(task)
    speakers: dict[int, Task] = {}  # task id -> task, for every placement's speaking task
    for job in jobs:
        kind, index = speaks_for_job(job.strategy)
        speakers.update({t.pk: t for t in tasks_of[job.pk] if (t.type, t.index) == (kind, index)})

    points: dict[int, list[tuple[Task, int, str, float, float]]] = defaultdict(list)
    rows = MetricPoint.objects.filter(task_id__in=list(speakers), phase="epoch_end", epoch__isnull=False)
    for task_id, epoch, name, value, ts in rows.values_list("task_id", "epoch", "name", "value", "ts"):
        task = speakers[task_id]
        points[task.job_id].append((task, epoch, name, value, ts))

    throughput = _throughput(tasks)
    runs = []
    for job in jobs:
        starts = [t.started_at for t in tasks_of[job.pk] if t.started_at is not None]
        first_start = min(starts) if starts else job.started_at
        kind, index = speaks_for_job(job.strategy)
        runs.append(
            JobRun(
                job=job,
                speaker=f"{kind} {index}",
                epochs=_epochs(points[job.pk], first_start),
                examples_per_s=throughput.get(job.pk),
                run_s=_between(first_start, job.finished_at),
            )
        )
    return runs


def _epochs(points: list[tuple[Task, int, str, float, float]], first_start: datetime | None) -> list[Epoch]:
    # (attempt, epoch) -> the task, its values and when the epoch ended
    reports: dict[tuple[int, int], tuple[Task, dict[str, float], float]] = {}
    for task, epoch, name, value, ts in points:
        _, values, end = reports.setdefault((task.attempt, epoch), (task, {}, ts))
        values[name] = value
        reports[(task.attempt, epoch)] = (task, values, max(end, ts))
    latest: dict[int, tuple[int, Task, dict[str, float], float]] = {}
    for (attempt, epoch), (task, values, end) in sorted(reports.items()):
        latest[epoch] = (attempt, task, values, end)  # sorted by attempt: the later placement's report wins

    origin = first_start.timestamp() if first_start is not None else None
    epochs: list[Epoch] = []
    cumulative: float | None = 0.0
    for number in sorted(latest):
        attempt, task, values, end = latest[number]
        values = dict(values)
        wall = values.pop("epoch_time_s", None)
        if wall is None:
            # A script reporting through report() has no epoch_time_s: the gap since its previous epoch's end, or
            # since its task started for the first epoch it ran (that one then includes start-up).
            previous = reports.get((attempt, number - 1))
            if previous is not None:
                wall = end - previous[2]
            elif task.started_at is not None:
                wall = end - task.started_at.timestamp()
        cumulative = cumulative + wall if cumulative is not None and wall is not None else None
        elapsed = end - origin if origin is not None else cumulative
        epochs.append(Epoch(number=number, wall_s=wall, elapsed_s=elapsed, values=values))
    return epochs


def _throughput(tasks: list[Task]) -> dict[int, float]:
    """Per job: each task's mean training examples_per_s, summed over the tasks of one placement.

    The runtime counts each task's share of a synchronous global batch (the whole batch for a ParameterServer
    coordinator; its workers report nothing), so the sum is the job's examples/s. A restarted job counts its last
    placement that reported any."""
    by_pk = {t.pk: t for t in tasks}
    means = (
        MetricPoint.objects.filter(task_id__in=list(by_pk), phase="train", name="examples_per_s")
        .values("task_id")
        .annotate(mean=Avg("value"))
    )
    per_placement: dict[tuple[int, int], float] = defaultdict(float)
    for row in means:
        task = by_pk[row["task_id"]]
        per_placement[(task.job_id, task.attempt)] += row["mean"]
    result: dict[int, float] = {}
    for (job_id, _attempt), total in sorted(per_placement.items()):
        result[job_id] = total  # sorted by attempt: the last placement's wins
    return result


def _between(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start is not None and end is not None else None


def chart_data(runs: list[JobRun], metrics: list[str], label: Callable[[JobRun], str]) -> dict[str, Any]:
    """What compare.js draws (the job comparison and the experiment page): per run its epoch numbers, elapsed seconds
    and each metric's values."""
    return {
        "metrics": metrics,
        "jobs": [
            {
                "id": run.job.pk,
                "label": label(run),
                "epoch": [e.number for e in run.epochs],
                "elapsed": [e.elapsed_s for e in run.epochs],
                "values": {m: [e.values.get(m) for e in run.epochs] for m in metrics},
            }
            for run in runs
        ],
    }
