"""The rules the New job form shows before a run, against the runtime's: the calculator's figures, the training set
sizes behind steps per epoch, and a script's hyperparameters (checked as the builtins' are, passed as TFDASH_*)."""

from __future__ import annotations

import pytest

from contracts import batching
from contracts.run_config import ConfigError, RunConfig, parse_script_config, script_env, train_examples
from worker_agent.runtime import data


@pytest.mark.parametrize(
    ("strategy", "workers", "devices", "replicas", "machine"),
    [
        ("mirrored", 1, 4, 4, 64),
        ("multi_worker_mirrored", 2, 2, 4, 32),
        ("parameter_server", 3, 2, 2, 32),  # one worker's devices step together; the others run their own steps
    ],
)
def test_the_calculator_counts_replicas_as_tensorflow_does(strategy, workers, devices, replicas, machine):
    calc = batching.calculate(strategy, workers, devices, 16, 0.01, "linear", 1.0, 1438)

    assert calc.batches.replicas_in_sync == replicas
    assert calc.batches.global_batch == 16 * replicas and calc.batches.machine_batch == machine
    assert calc.effective_learning_rate == pytest.approx(0.01 * replicas)
    assert calc.steps_per_epoch == batching.default_steps_per_epoch(1438, 16 * replicas)
    assert calc.warmup_steps == calc.steps_per_epoch


def test_the_calculator_refuses_what_the_runtime_refuses():
    with pytest.raises(ValueError, match="exactly one machine"):
        batching.calculate("mirrored", 2, 1, 16, 0.01, "linear", 0, None)
    with pytest.raises(ValueError, match="learning rate"):
        batching.calculate("mirrored", 1, 1, 16, 0.0, "linear", 0, None)
    unknown = batching.calculate("mirrored", 1, 1, 16, 0.01, "none", 0, None)
    assert (unknown.steps_per_epoch, unknown.warmup_steps, unknown.effective_learning_rate) == (None, None, 0.01)


@pytest.mark.parametrize(
    "config", [RunConfig("digits_mlp"), RunConfig("digits_cnn"), RunConfig("synthetic", examples=500)]
)
def test_the_training_set_sizes_are_the_ones_the_runtime_trains_on(config):
    assert train_examples(config) == len(data.load_arrays(config).x_train)


def test_a_scripts_hyperparameters_are_checked_and_become_its_variables():
    config = parse_script_config({"epochs": 3, "learning_rate": 0.01, "scale_lr": "none"})

    assert script_env(config) == {"TFDASH_EPOCHS": "3", "TFDASH_LEARNING_RATE": "0.01", "TFDASH_SCALE_LR": "none"}
    with pytest.raises(ConfigError, match="unknown config key"):
        parse_script_config({"hidden": [8]})
    with pytest.raises(ConfigError, match="epochs must be between"):
        parse_script_config({"epochs": 0})
