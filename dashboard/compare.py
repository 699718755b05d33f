"""What a side-by-side comparison of finished jobs shows, computed from their stored rows and metric points.

The seed's "run both on your hardware and compare": per job, the wall time of each epoch, the throughput, the final
loss and accuracy, and the epoch-end metrics as series for charts overlaid on an epoch or a wall-time axis.

The numbers themselves (whose epochs, which placement's, throughput) are orchestrator/metrics/runs.py's, the same
ones experiments show.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from orchestrator.metrics.runs import METRICS, Epoch, JobRun, chart_data, load_runs
from orchestrator.models import TERMINAL_JOB_STATES, Job

MIN_JOBS = 2
MAX_JOBS = 8  # past this the charts' colours and the columns stop being readable
_MAX_PK = 2**31 - 1  # Job ids are 32-bit: a larger number is simply no job (and no database error)

_LOWER_IS_BETTER = {"loss": True, "accuracy": False, "val_loss": True, "val_accuracy": False}


class CannotCompare(Exception):
    """A request that names no comparable set of jobs; the message is for the person, `status` for the response."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


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
            _measured(
                "mean_epoch_s", "Wall time per epoch (mean)", [r.mean_epoch_s for r in self.runs], format_seconds
            ),
            _measured("run_s", "Run time (first start to end)", [r.run_s for r in self.runs], format_seconds),
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
        return chart_data(
            self.runs, self.metrics, lambda r: f"#{r.job.pk} {r.job.name} ({r.job.get_strategy_display()})"
        )


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
    runs = load_runs(jobs)
    reported = {name for run in runs for epoch in run.epochs for name in epoch.values}
    return Comparison(runs=runs, metrics=[m for m in METRICS if m in reported])


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


def format_seconds(value: float) -> str:
    if value >= 120:
        minutes, seconds = divmod(value, 60)
        return f"{int(minutes)} min {seconds:.0f} s"
    return f"{value:.1f} s"


def _shape(job: Job) -> str:
    workers = f"{job.workers} worker{'' if job.workers == 1 else 's'}"
    ps = f" + {job.ps} ps" if job.ps else ""
    devices = f"{job.devices_per_worker} device{'' if job.devices_per_worker == 1 else 's'}"
    return f"{workers}{ps} × {devices}"


def _numbers(ids: list[int]) -> str:
    return ", ".join(f"#{i}" for i in ids)
