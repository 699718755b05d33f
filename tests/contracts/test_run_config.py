"""The builtin config: defaults, one-line refusals, and the runtime's exit code 2 before TensorFlow loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from contracts.programs import BUILTIN_PROGRAMS
from contracts.run_config import ConfigError, parse_config
from tests.support.processes import ROOT


def test_defaults() -> None:
    config = parse_config("digits_mlp", "{}")
    assert (config.per_replica_batch, config.epochs, config.learning_rate) == (32, 5, 0.001)
    assert (config.scale_lr, config.warmup_epochs, config.optimizer) == ("linear", 0.0, "adam")
    assert config.steps_per_epoch is None
    assert config.checkpoint is True
    assert config.hidden == (256, 256)
    assert "examples" not in config.as_facts()  # synthetic-only keys are not part of a digits config


def test_program_specific_keys() -> None:
    config = parse_config("synthetic", {"examples": 1000, "features": 8, "classes": 3, "hidden": [16]})
    assert (config.examples, config.features, config.classes, config.hidden) == (1000, 8, 3, (16,))


def test_every_builtin_program_parses_with_its_defaults(tmp_path: Path) -> None:
    data = tmp_path / "d.npz"
    np.savez(data, x_train=np.zeros((4, 2)), y_train=np.zeros(4))
    for program in BUILTIN_PROGRAMS:
        config = parse_config(program, {"data_path": str(data)} if program == "npz" else None)
        assert config.program == program


@pytest.mark.parametrize(
    ("program", "raw", "message"),
    [
        ("resnet", "{}", "unknown program 'resnet'"),
        ("digits_mlp", "{", "not valid JSON"),
        ("digits_mlp", "[1]", "must be a JSON object"),
        ("digits_mlp", '{"epoch": 3}', "unknown config key(s) 'epoch'"),
        ("digits_mlp", '{"examples": 3}', "unknown config key(s) 'examples' for digits_mlp"),
        ("digits_cnn", '{"hidden": [3]}', "unknown config key(s) 'hidden'"),
        ("digits_mlp", '{"per_replica_batch": 0}', "per_replica_batch must be between 1"),
        ("digits_mlp", '{"per_replica_batch": 3.5}', "per_replica_batch must be an integer"),
        ("digits_mlp", '{"epochs": true}', "epochs must be an integer"),
        ("digits_mlp", '{"learning_rate": 0}', "learning_rate must be greater than 0"),
        ("digits_mlp", '{"learning_rate": "fast"}', "learning_rate must be a finite number"),
        ("digits_mlp", '{"scale_lr": "sqrt"}', "scale_lr must be one of linear, none"),
        ("digits_mlp", '{"optimizer": "rmsprop"}', "optimizer must be one of adam, sgd"),
        ("digits_mlp", '{"warmup_epochs": -1}', "warmup_epochs must be at least 0"),
        ("digits_mlp", '{"checkpoint": "yes"}', "checkpoint must be true or false"),
        ("digits_mlp", '{"steps_per_epoch": 0}', "steps_per_epoch must be between 1"),
        ("digits_mlp", '{"hidden": []}', "hidden must be a list of 1 to 16"),
        ("synthetic", '{"classes": 1}', "classes must be between 2"),
        ("npz", "{}", "npz needs data_path"),
        ("npz", '{"data_path": "/nonexistent/x.npz"}', "is not a readable file"),
    ],
)
def test_bad_configs_are_refused_with_a_reason(program: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(program, raw)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def _runtime(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker_agent.runtime", *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_runtime_exits_2_with_one_line_before_importing_tensorflow() -> None:
    # Each refusal comes back fast: the check runs before the seconds-long TensorFlow import.
    bad = _runtime(["--program", "digits_mlp", "--config-json", json.dumps({"epochs": 0})])
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["tfdash runtime: epochs must be between 1 and 100000, not 0"]

    unknown = _runtime(["--program", "nope"])
    assert unknown.returncode == 2
    assert "unknown program 'nope'" in unknown.stderr

    extra = _runtime(["--program", "digits_mlp", "--epochs", "3"])
    assert extra.returncode == 2
    assert "bad arguments: unrecognized arguments: --epochs 3" in extra.stderr


def test_the_runtime_reads_its_config_from_its_environment_not_its_command_line() -> None:
    # The agent hands a builtin its config in TFDASH_PROGRAM_CONFIG: a command line is readable by other local users.
    bad = _runtime(["--program", "digits_mlp"], env={"TFDASH_PROGRAM_CONFIG": json.dumps({"epochs": 0})})
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["tfdash runtime: epochs must be between 1 and 100000, not 0"]


def test_keras3_is_refused_for_multi_worker_strategies() -> None:
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    refused = _runtime(["--program", "digits_mlp"], env={"TF_CONFIG": tf_config})
    assert refused.returncode == 2
    assert "Keras 3 `model.fit` does not work under multi_worker_mirrored (keras-team/keras#20585)" in refused.stderr
    assert "TF_USE_LEGACY_KERAS=1" in refused.stderr

    evaluator = json.dumps({"cluster": {**cluster, "evaluator": ["127.0.0.1:3"]}, "task": {"type": "evaluator"}})
    refused = _runtime(["--program", "digits_mlp"], env={"TF_CONFIG": evaluator, "TF_USE_LEGACY_KERAS": "1"})
    assert refused.returncode == 2
    assert "do not run 'evaluator' tasks" in refused.stderr
