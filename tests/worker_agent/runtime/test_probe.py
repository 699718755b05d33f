"""The environment probe (`-m worker_agent.runtime.probe`, interfaces.md item 2) against real interpreters: the
product's venv (TensorFlow 2.21, Keras 3 or tf_keras), the TensorFlow 2.15 environment of scripts/task_envs.sh, and a
Python without TensorFlow. Each prints exactly one JSON line on stdout and exits 0, from the runtime set's copy."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from worker_agent.supervision.runtime_root import runtime_pythonpath

KEYS = {"python", "tensorflow", "keras", "keras_flavor", "gpus", "cuda_build", "cudnn_build", "error"}
TF215 = Path(os.environ.get("TFDASH_TASK_ENVS_DIR") or Path(__file__).resolve().parents[3] / "var" / "envs") / "tf215"


def run_probe(python: Path | str, workdir: Path, *options: str, **extra: str) -> dict[str, Any]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join(runtime_pythonpath(workdir)),
        "CUDA_VISIBLE_DEVICES": "",
        **extra,
    }
    result = subprocess.run(
        [str(python), *options, "-m", "worker_agent.runtime.probe"],
        env=env,
        cwd=workdir.parent,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = result.stdout.splitlines()  # TensorFlow's own chatter went to stderr
    found = json.loads(line)
    assert set(found) == KEYS
    return found


def test_the_product_venv_with_keras_3_and_with_tf_keras(tmp_path: Path) -> None:
    found = run_probe(sys.executable, tmp_path / "agent")
    assert found["python"] == platform.python_version()
    assert (found["tensorflow"], found["keras_flavor"], found["error"]) == ("2.21.0", "keras3", "")
    assert found["keras"].startswith("3.")
    assert (found["gpus"], found["cuda_build"], found["cudnn_build"]) == ([], "", "")  # tensorflow-cpu

    legacy = run_probe(sys.executable, tmp_path / "agent", TF_USE_LEGACY_KERAS="1")
    assert (legacy["keras_flavor"], legacy["keras"]) == ("tf_keras", "2.21.0")


def test_the_tensorflow_2_15_environment(tmp_path: Path) -> None:
    python = TF215 / "bin" / "python"
    if not (TF215 / ".tfdash-env").is_file():
        pytest.skip(f"no TensorFlow 2.15 environment at {TF215}: `bash scripts/task_envs.sh` builds it")
    found = run_probe(python, tmp_path / "agent")
    assert (found["tensorflow"], found["keras"], found["keras_flavor"]) == ("2.15.1", "2.15.0", "keras2")
    assert (found["gpus"], found["cuda_build"], found["error"]) == ([], "", "")


def test_a_python_without_tensorflow_says_so_and_still_exits_0(tmp_path: Path) -> None:
    found = run_probe(sys.executable, tmp_path / "agent", "-S")  # no site-packages: no TensorFlow
    assert found["tensorflow"] == "" and found["keras_flavor"] == ""
    assert found["error"].startswith("import tensorflow failed: ModuleNotFoundError")
