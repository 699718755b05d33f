"""Batch-size and learning-rate rules (plain Python: no TensorFlow)."""

from __future__ import annotations

import itertools

import pytest

from contracts.batching import (
    default_steps_per_epoch,
    effective_learning_rate,
    learning_rate_at,
    plan_batches,
    plan_learning_rate,
    warmup_steps,
)
from contracts.strategies import Strategy

MIRRORED = Strategy.MIRRORED
MULTI_WORKER_MIRRORED = Strategy.MULTI_WORKER_MIRRORED
PARAMETER_SERVER = Strategy.PARAMETER_SERVER


def test_mirrored_splits_the_global_batch_over_the_devices_of_one_machine() -> None:
    plan = plan_batches(MIRRORED, per_replica_batch=32, replicas_in_sync=2, workers=1)
    assert (plan.global_batch, plan.machine_batch, plan.per_device_batch) == (64, 64, 32)
    assert plan.devices_per_machine == 2
    assert plan.examples_per_step_this_task == 64


def test_multi_worker_mirrored_splits_it_over_workers_then_devices() -> None:
    plan = plan_batches(MULTI_WORKER_MIRRORED, per_replica_batch=32, replicas_in_sync=8, workers=2)
    assert (plan.global_batch, plan.machine_batch, plan.per_device_batch) == (256, 128, 32)
    assert plan.devices_per_machine == 4
    assert plan.examples_per_step_this_task == 128  # this worker's share of each step


def test_parameter_server_runs_each_step_on_one_worker() -> None:
    # TF's ParameterServerStrategy has one worker's devices in sync: each worker applies its own updates.
    plan = plan_batches(PARAMETER_SERVER, per_replica_batch=32, replicas_in_sync=1, workers=2)
    assert (plan.global_batch, plan.machine_batch, plan.per_device_batch) == (32, 32, 32)
    assert plan.examples_per_step_this_task == 32  # the coordinator accounts for every step it dispatches
    gpus = plan_batches(PARAMETER_SERVER, per_replica_batch=16, replicas_in_sync=4, workers=3)
    assert (gpus.global_batch, gpus.machine_batch, gpus.per_device_batch) == (64, 64, 16)


@pytest.mark.parametrize(
    ("strategy", "replicas", "workers", "message"),
    [
        ("horovod", 2, 1, "unknown strategy"),
        (MIRRORED, 2, 2, "exactly one machine"),
        (MULTI_WORKER_MIRRORED, 3, 2, "do not divide"),
        (MIRRORED, 0, 1, "positive"),
    ],
)
def test_impossible_shapes_are_refused(strategy: str, replicas: int, workers: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_batches(strategy, per_replica_batch=32, replicas_in_sync=replicas, workers=workers)


def test_linear_scaling_multiplies_the_base_rate_by_the_replicas() -> None:
    assert effective_learning_rate(0.001, 2, "linear") == pytest.approx(0.002)
    assert effective_learning_rate(0.1, 8, "linear") == pytest.approx(0.8)
    assert effective_learning_rate(0.001, 8, "none") == 0.001
    with pytest.raises(ValueError, match="scale_lr"):
        effective_learning_rate(0.001, 2, "sqrt")


def test_warmup_rises_linearly_from_base_to_effective_per_step_then_stays() -> None:
    assert warmup_steps(2.5, 10) == 25
    assert warmup_steps(0, 10) == 0
    rates = [learning_rate_at(step, 0.1, 0.4, warmup=10) for step in range(13)]
    assert rates[0] == pytest.approx(0.1)
    assert rates[5] == pytest.approx(0.25)
    assert rates[10:] == [pytest.approx(0.4)] * 3
    assert all(b > a for a, b in itertools.pairwise(rates[:11]))
    assert learning_rate_at(0, 0.1, 0.4, warmup=0) == pytest.approx(0.4)  # no warm-up: effective from step 0


def test_learning_rate_plan_lists_the_schedule_at_telling_steps() -> None:
    plan = plan_learning_rate(0.001, 4, "linear", warmup_epochs=1, steps_per_epoch=20, epochs=3)
    assert plan.effective_learning_rate == pytest.approx(0.004)
    assert plan.warmup_steps == 20
    marks = dict(plan.marks())
    assert marks[0] == pytest.approx(0.001)
    assert marks[10] == pytest.approx(0.0025)
    assert marks[20] == pytest.approx(0.004)
    assert marks[60] == pytest.approx(0.004)
    facts = plan.as_facts()
    assert facts["lr_schedule"][0] == [0, pytest.approx(0.001)]
    assert len(plan_learning_rate(0.1, 1, "none", 3, 1000, 500).marks()) <= 12


def test_an_epoch_is_one_pass_in_whole_global_batches() -> None:
    assert default_steps_per_epoch(1438, 64) == 22
    assert default_steps_per_epoch(10, 64) == 1
