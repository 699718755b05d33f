"""A job's shape as placement sees it: its strategy, worker and ps counts, devices per worker and labels (`JobShape`),
whether it is valid, the processes it needs (`TaskSpec`) and the devices they hold, and whether free device counts can
hold it at all (`fits_free_counts`, asked before a full placement). Plain Python (no Django)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from contracts.limits import MAX_DEVICES_PER_WORKER, MAX_PS, MAX_WORKERS
from contracts.strategies import Strategy, TaskType


@dataclass(frozen=True)
class JobShape:
    strategy: Strategy
    workers: int
    ps: int
    devices_per_worker: int
    labels: frozenset[str] = frozenset()

    def __hash__(self) -> int:
        # Hashed once: a pass looks every waiting job's shape up in several caches (thousands of jobs, a few dozen
        # shapes), and the generated __hash__ builds and hashes the tuple of fields on every call.
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = self.__dict__["_hash"] = hash((self.strategy, self.workers, self.ps, self.devices_per_worker,
                                                    self.labels))  # fmt: skip
        return cached


@dataclass(frozen=True)
class TaskSpec:
    """One process a job needs, before it has a host."""

    type: str
    index: int
    devices: int


def validate_shape(shape: JobShape) -> list[tuple[str, str]]:
    """What is wrong with the shape, as (field, message) pairs: the field is the job's (`workers`, `ps`, ...)."""
    errors: list[tuple[str, str]] = []
    try:
        strategy = Strategy(shape.strategy)
    except ValueError:
        choices = ", ".join(s.value for s in Strategy)
        return [("strategy", f"unknown strategy {shape.strategy!r}; choose one of {choices}")]
    if strategy is Strategy.MIRRORED:
        if shape.workers != 1:
            errors.append(("workers", f"mirrored runs exactly 1 worker, not {shape.workers}"))
        if shape.ps != 0:
            errors.append(("ps", "mirrored takes no parameter servers"))
    elif strategy is Strategy.MULTI_WORKER_MIRRORED:
        if shape.workers < 1:
            errors.append(("workers", "multi_worker_mirrored needs at least 1 worker"))
        if shape.ps != 0:
            errors.append(("ps", "multi_worker_mirrored takes no parameter servers"))
    else:
        if shape.workers < 1:
            errors.append(("workers", "parameter_server needs at least 1 worker"))
        if shape.ps < 1:
            errors.append(("ps", "parameter_server needs at least 1 ps"))
    if shape.workers > MAX_WORKERS:
        errors.append(("workers", f"at most {MAX_WORKERS} workers, not {shape.workers}"))
    if shape.ps > MAX_PS:
        errors.append(("ps", f"at most {MAX_PS} ps, not {shape.ps}"))
    if shape.devices_per_worker < 1:
        errors.append(("devices_per_worker", "devices_per_worker must be at least 1"))
    elif shape.devices_per_worker > MAX_DEVICES_PER_WORKER:
        errors.append(
            (
                "devices_per_worker",
                f"at most {MAX_DEVICES_PER_WORKER} devices per worker, not {shape.devices_per_worker}",
            )
        )
    return errors


@lru_cache(maxsize=1024)
def required_tasks(shape: JobShape) -> tuple[TaskSpec, ...]:
    """The processes a (valid) shape needs, in TF_CONFIG role order (asked by every placement: made once per shape;
    TaskSpecs are frozen)."""
    d = shape.devices_per_worker
    strategy = Strategy(shape.strategy)
    if strategy is Strategy.MIRRORED:
        return (TaskSpec(TaskType.WORKER, 0, d),)
    workers = tuple(TaskSpec(TaskType.WORKER, i, d) for i in range(shape.workers))
    if strategy is Strategy.MULTI_WORKER_MIRRORED:
        return workers
    chief = (TaskSpec(TaskType.CHIEF, 0, 0),)
    return chief + workers + tuple(TaskSpec(TaskType.PS, i, 0) for i in range(shape.ps))


@lru_cache(maxsize=1024)
def devices_needed(shape: JobShape) -> int:
    """The devices a (valid) shape holds in all (asked of every waiting job, every pass: a queue has a few shapes)."""
    return sum(task.devices for task in required_tasks(shape))


@lru_cache(maxsize=1024)
def device_tasks(shape: JobShape) -> int:
    """How many of a (valid) shape's tasks hold devices: its workers (`devices_per_worker` each, on one host)."""
    return 1 if Strategy(shape.strategy) is Strategy.MIRRORED else shape.workers


def fit_count(devices_per_task: int, free: int) -> int:
    """How many tasks of `devices_per_task` devices a host with `free` free devices holds."""
    return free // devices_per_task


def fits_free_counts(shape: JobShape, free_counts: Iterable[int]) -> bool:
    """Whether the shape's device-holding tasks fit hosts with these free device counts, ports aside. Every such task
    takes `devices_per_worker` devices of one host, so wherever it lands it lowers the sum of `fit_count` by exactly
    one: they fit exactly when that sum reaches their number, and then any greedy order (spread or pack) places them
    all. The planner asks this before a full placement (most of its tries on a busy fleet do not fit)."""
    return sum(fit_count(shape.devices_per_worker, c) for c in free_counts) >= device_tasks(shape)
