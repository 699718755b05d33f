"""Batch-size and learning-rate rules: plain Python, no TensorFlow, so the orchestrator and tests can use them.

Terms (TensorFlow's):
- replicas in sync: the model copies whose gradients are averaged in one step. Mirrored: the devices of the one
  machine; MultiWorkerMirrored: every device of every worker; ParameterServer: the devices of ONE worker, because each
  worker applies its own update to the variables on the ps tasks (asynchronous training), so no step is shared.
- global batch = per-replica batch x replicas in sync: the examples behind one optimizer update.
- machine batch: the part of a step's global batch one machine computes. Synchronous strategies split a step over the
  workers (global / workers); under ParameterServer one worker computes a whole step (machine = global), and the
  workers run different steps at the same time.
- per-device batch = machine batch / devices on that machine (= the per-replica batch).

Learning rate: with scale_lr "linear" the effective rate is base x replicas in sync (the linear scaling rule of
Goyal et al., "Accurate, Large Minibatch SGD", 2017); warm-up then rises linearly, per step, from the unscaled base
rate to the effective rate over `warmup_epochs` epochs, as in that paper, and stays there.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from contracts.strategies import Strategy

SCALE_RULES = ("linear", "none")


@dataclass(frozen=True)
class BatchPlan:
    strategy: str
    replicas_in_sync: int
    workers: int
    devices_per_machine: int
    per_replica_batch: int
    global_batch: int
    machine_batch: int
    per_device_batch: int
    # Examples this task's process accounts for per training step: its share of a synchronous step, or every example
    # of every step for the ParameterServer coordinator (it dispatches them all). The base of `examples_per_s`.
    examples_per_step_this_task: int

    def as_facts(self) -> dict[str, Any]:
        return asdict(self)


def plan_batches(strategy: str, per_replica_batch: int, replicas_in_sync: int, workers: int) -> BatchPlan:
    """The batch sizes of a run. `workers` counts the machines that compute (MWMS: chief + workers; PS: workers)."""
    if strategy not in tuple(Strategy):
        raise ValueError(f"unknown strategy {strategy!r}")
    if per_replica_batch < 1 or replicas_in_sync < 1 or workers < 1:
        raise ValueError("batch, replicas and workers must be positive")
    if strategy == Strategy.MIRRORED and workers != 1:
        raise ValueError("a mirrored run has exactly one machine")
    global_batch = per_replica_batch * replicas_in_sync
    if strategy == Strategy.PARAMETER_SERVER:
        devices = replicas_in_sync  # one worker's devices run one step
        machine_batch = global_batch
        this_task = global_batch
    else:
        if replicas_in_sync % workers:
            raise ValueError(f"{replicas_in_sync} replicas do not divide over {workers} workers")
        devices = replicas_in_sync // workers
        machine_batch = global_batch // workers
        this_task = machine_batch
    return BatchPlan(
        strategy=strategy,
        replicas_in_sync=replicas_in_sync,
        workers=workers,
        devices_per_machine=devices,
        per_replica_batch=per_replica_batch,
        global_batch=global_batch,
        machine_batch=machine_batch,
        per_device_batch=machine_batch // devices,
        examples_per_step_this_task=this_task,
    )


def effective_learning_rate(base: float, replicas_in_sync: int, scale_lr: str) -> float:
    """The rate after warm-up: base x replicas with the linear scaling rule, else base."""
    if scale_lr not in SCALE_RULES:
        raise ValueError(f"scale_lr must be one of {SCALE_RULES}, not {scale_lr!r}")
    return base * replicas_in_sync if scale_lr == "linear" else base


def default_steps_per_epoch(train_examples: int, global_batch: int) -> int:
    """One pass over the training data in whole global batches (at least one step)."""
    return max(1, train_examples // global_batch)


def warmup_steps(warmup_epochs: float, steps_per_epoch: int) -> int:
    return max(0, math.ceil(warmup_epochs * steps_per_epoch))


def learning_rate_at(step: int, base: float, effective: float, warmup: int) -> float:
    """The rate used by optimizer step `step` (0-based): linear from base to effective over `warmup` steps."""
    if warmup <= 0 or step >= warmup:
        return effective
    return base + (effective - base) * (max(step, 0) / warmup)


@dataclass(frozen=True)
class LearningRatePlan:
    base_learning_rate: float
    effective_learning_rate: float
    scale_lr: str
    warmup_epochs: float
    warmup_steps: int
    steps_per_epoch: int
    epochs: int

    def at(self, step: int) -> float:
        return learning_rate_at(step, self.base_learning_rate, self.effective_learning_rate, self.warmup_steps)

    def marks(self) -> list[tuple[int, float]]:
        """(step, rate) at a few telling points: the start, warm-up quarters, its end, each epoch boundary (<= 12)."""
        total = self.steps_per_epoch * self.epochs
        steps = {0, total}
        if self.warmup_steps:
            steps.update(self.warmup_steps * q // 4 for q in range(1, 5))
        epoch_marks = [self.steps_per_epoch * e for e in range(1, self.epochs + 1)]
        stride = max(1, math.ceil(len(epoch_marks) / 6))
        steps.update(epoch_marks[::stride])
        return [(s, self.at(s)) for s in sorted(steps) if s <= total][:12]

    def as_facts(self) -> dict[str, Any]:
        facts = asdict(self)
        facts["lr_schedule"] = [[step, rate] for step, rate in self.marks()]
        return facts


def plan_learning_rate(
    base: float, replicas_in_sync: int, scale_lr: str, warmup_epochs: float, steps_per_epoch: int, epochs: int
) -> LearningRatePlan:
    return LearningRatePlan(
        base_learning_rate=base,
        effective_learning_rate=effective_learning_rate(base, replicas_in_sync, scale_lr),
        scale_lr=scale_lr,
        warmup_epochs=warmup_epochs,
        warmup_steps=warmup_steps(warmup_epochs, steps_per_epoch),
        steps_per_epoch=steps_per_epoch,
        epochs=epochs,
    )


def replicas_for_shape(strategy: str, workers: int, devices_per_worker: int) -> int:
    """Replicas in sync as TensorFlow will count them for a job's shape: every device of every worker under
    MultiWorkerMirrored, one machine's devices under Mirrored and ParameterServer (see the module's terms)."""
    return workers * devices_per_worker if strategy == Strategy.MULTI_WORKER_MIRRORED else devices_per_worker


@dataclass(frozen=True)
class Calculation:
    """What a job of this shape and these hyperparameters will use, before it runs (the New job form's calculator):
    the runtime computes the same through plan_batches and plan_learning_rate."""

    batches: BatchPlan
    effective_learning_rate: float
    steps_per_epoch: int | None  # None: the training set's size is unknown until the run reads it (an .npz file)
    warmup_steps: int | None


def calculate(
    strategy: str,
    workers: int,
    devices_per_worker: int,
    per_replica_batch: int,
    learning_rate: float,
    scale_lr: str,
    warmup_epochs: float,
    train_examples: int | None,
) -> Calculation:
    """Raises ValueError with a one-line reason for a shape or value the runtime would refuse."""
    if not learning_rate > 0 or not warmup_epochs >= 0:
        raise ValueError("the learning rate must be above 0 and the warm-up at least 0")
    if devices_per_worker < 1:
        raise ValueError("batch, replicas and workers must be positive")
    replicas = replicas_for_shape(strategy, workers, devices_per_worker)
    batches = plan_batches(strategy, per_replica_batch, replicas, workers)
    steps = None if train_examples is None else default_steps_per_epoch(train_examples, batches.global_batch)
    return Calculation(
        batches=batches,
        effective_learning_rate=effective_learning_rate(learning_rate, replicas, scale_lr),
        steps_per_epoch=steps,
        warmup_steps=None if steps is None else warmup_steps(warmup_epochs, steps),
    )
