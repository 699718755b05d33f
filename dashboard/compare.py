"""What a side-by-side comparison of finished jobs shows, computed from their stored rows and metric points.

The seed's "run both on your hardware and compare": per job, the wall time of each epoch, the throughput, the final
loss and accuracy, and the epoch-end metrics as series for charts overlaid on an epoch or a wall-time axis.

Whose numbers: epoch-end metrics are those of the task that speaks for the job
(`contracts.strategies.speaks_for_job`: the chief of a ParameterServer job, worker 0 otherwise; the same task whose
facts become `Job.facts`). A job restarted from a
checkpoint reports some epochs twice (once per placement); the later placement's report of an epoch wins.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Avg, QuerySet

from contracts.strategies import speaks_for_job
from orchestrator.models import TERMINAL_JOB_STATES, Job, MetricPoint, Task

MIN_JOBS = 2
MAX_JOBS = 8  # past this the charts' colours and the columns stop being readable
_MAX_PK = 2**31 - 1  # Job ids are 32-bit: a larger number is simply no job (and no database error)

# Epoch-end metrics compared (table and charts), in this order, when any compared job reported them.
METRICS = ("loss", "accuracy", "val_loss", "val_accuracy")
_LOWER_IS_BETTER = {"loss": True, "accuracy": False, "val_loss": True, "val_accuracy": False}


class CannotCompare(Exception):
    """A request that names no comparable set of jobs; the message is for the person, `status` for the response."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


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


@dataclass(frozen=True)
class Cell:
    text: str
    best: bool = False


@dataclass(frozen=True)
class Row:
    key: str  # stable, for tests and styling
    label: str
    cells: list[Cell]


@dataclass
class Comparison:
    runs: list[JobRun]
    metrics: list[str] = field(default_factory=list)  # METRICS that at least one job reported

    @property
    def jobs(self) -> list[Job]:
        return [run.job for run in self.runs]

    def summary(self) -> list[Row]:
        """One row per quantity, one cell per job; the best value of a row is marked where "best" means something."""
        rows = [
            Row("strategy", "Strategy", [Cell(r.job.get_strategy_display()) for r in self.runs]),
            Row("shape", "Shape", [Cell(_shape(r.job)) for r in self.runs]),
            Row("state", "State", [Cell(r.job.state) for r in self.runs]),
        ]
        for key, label in (("replicas_in_sync", "Replicas in sync"), ("global_batch", "Global batch")):
            facts = [r.job.facts.get(key) if isinstance(r.job.facts, dict) else None for r in self.runs]
            if any(v is not None for v in facts):
                rows.append(Row(key, label, [Cell("—" if v is None else str(v)) for v in facts]))
        rows += [
            Row("epochs", "Epochs", [Cell(str(len(r.epochs))) for r in self.runs]),
            _measured("mean_epoch_s", "Wall time per epoch (mean)", [r.mean_epoch_s for r in self.runs], _seconds),
            _measured("run_s", "Run time (first start to end)", [r.run_s for r in self.runs], _seconds),
            _measured(
                "examples_per_s",
                "Examples/s (training)",
                [r.examples_per_s for r in self.runs],
                lambda v: f"{v:,.0f}",
                lower_is_better=False,
            ),
        ]
        for name in self.metrics:
            rows.append(
                _measured(
                    f"final_{name}",
                    f"Final {name}",
                    [r.final.get(name) for r in self.runs],
                    lambda v: f"{v:.4f}",
                    lower_is_better=_LOWER_IS_BETTER[name],
                )
            )
        return rows

    def epoch_rows(self) -> list[tuple[int, list[Epoch | None]]]:
        """Epoch number, and each job's epoch of that number (None where a job ran fewer)."""
        by_number = [{e.number: e for e in r.epochs} for r in self.runs]
        numbers = sorted({n for epochs in by_number for n in epochs})
        return [(n, [epochs.get(n) for epochs in by_number]) for n in numbers]

    def chart_data(self) -> dict[str, Any]:
        """What compare.js draws: per job, its epoch numbers, elapsed seconds and each metric's values."""
        return {
            "metrics": self.metrics,
            "jobs": [
                {
                    "id": r.job.pk,
                    "label": f"#{r.job.pk} {r.job.name} ({r.job.get_strategy_display()})",
                    "epoch": [e.number for e in r.epochs],
                    "elapsed": [e.elapsed_s for e in r.epochs],
                    "values": {m: [e.values.get(m) for e in r.epochs] for m in self.metrics},
                }
                for r in self.runs
            ],
        }


def parse_ids(values: Iterable[str]) -> list[int]:
    """Job ids from `?ids=3&ids=5` or `?ids=3,5`, in order, each once; raises CannotCompare for anything else."""
    ids: list[int] = []
    for value in values:
        for raw in value.split(","):
            part = raw.strip().lstrip("#")
            if not part:
                continue
            if not (part.isascii() and part.isdigit()):
                raise CannotCompare(f"“{part[:40]}” is not a job number.")
            ids.append(int(part))
    return list(dict.fromkeys(ids))


def compare(visible: QuerySet[Job], ids: list[int]) -> Comparison:
    """The comparison of jobs `ids`, each of which must be in `visible` (the person's jobs) and finished."""
    if len(ids) < MIN_JOBS:
        raise CannotCompare("Choose at least two finished jobs to compare.")
    if len(ids) > MAX_JOBS:
        raise CannotCompare(f"Compare at most {MAX_JOBS} jobs at a time ({len(ids)} were chosen).")
    found = {job.pk: job for job in visible.filter(pk__in=[i for i in ids if i <= _MAX_PK])}
    # Someone else's job reads exactly like a job that does not exist.
    missing = [i for i in ids if i not in found]
    if missing:
        raise CannotCompare(f"No job {_numbers(missing)} among the jobs you can see.", status=404)
    unfinished = [found[i] for i in ids if not found[i].is_terminal]
    if unfinished:
        states = ", ".join(f"#{j.pk} is {j.state}" for j in unfinished)
        raise CannotCompare(f"Only finished jobs ({', '.join(TERMINAL_JOB_STATES)}) can be compared: {states}.")
    jobs = sorted(found.values(), key=lambda j: j.pk)
    tasks = list(Task.objects.filter(job__in=jobs).only("pk", "job_id", "type", "index", "attempt", "started_at"))
    runs = _runs(jobs, tasks)
    reported = {name for run in runs for epoch in run.epochs for name in epoch.values}
    return Comparison(runs=runs, metrics=[m for m in METRICS if m in reported])


def _runs(jobs: list[Job], tasks: list[Task]) -> list[JobRun]:
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


def _measured(
    key: str,
    label: str,
    values: list[float | None],
    fmt: Callable[[float], str],
    *,
    lower_is_better: bool = True,
) -> Row:
    known = [v for v in values if v is not None]
    # "Best" only where the jobs differ: a tie marks nothing.
    best = (min(known) if lower_is_better else max(known)) if len(set(known)) > 1 else None
    return Row(key, label, [Cell("—") if v is None else Cell(fmt(v), best=v == best) for v in values])


def _seconds(value: float) -> str:
    if value >= 120:
        minutes, seconds = divmod(value, 60)
        return f"{int(minutes)} min {seconds:.0f} s"
    return f"{value:.1f} s"


def _between(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start is not None and end is not None else None


def _shape(job: Job) -> str:
    workers = f"{job.workers} worker{'' if job.workers == 1 else 's'}"
    ps = f" + {job.ps} ps" if job.ps else ""
    devices = f"{job.devices_per_worker} device{'' if job.devices_per_worker == 1 else 's'}"
    return f"{workers}{ps} × {devices}"


def _numbers(ids: list[int]) -> str:
    return ", ".join(f"#{i}" for i in ids)
