"""The runtime in a second task environment: TensorFlow 2.15.1 with its own Keras 2 (the floor the runtime claims),
built by scripts/task_envs.sh in var/envs/tf215 (.ci/run builds it), as real TF processes.

Each process runs the environment's own interpreter with the task's PYTHONPATH as the agent makes it (the runtime
set's copy under a workdir: runtime_root.py), so nothing of the product's venv is on its path: the builtin program
and an unmodified user's `model.fit` (Mirrored, MultiWorkerMirrored) report their metrics, and so does `report()`.
Skipped, with the reason, only where the environment could not be built.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from tests.support.ports import free_ports
from tests.support.processes import ROOT
from tests.worker_agent.runtime._tasks import Task, describe, task_env, tasks, tf_config, wait_all
from worker_agent.supervision.runtime_root import runtime_pythonpath

ENVS = Path(os.environ.get("TFDASH_TASK_ENVS_DIR") or ROOT / "var" / "envs")
TF215 = ENVS / "tf215"
RUN_TIMEOUT_S = 240
PROGRAMS = ROOT / "tests" / "programs"


@pytest.fixture(scope="module")
def python() -> Path:
    interpreter = TF215 / "bin" / "python"
    if interpreter.is_file() and (TF215 / ".tfdash-env").is_file():
        return interpreter
    failed = ENVS / "tf215.failed"
    why = failed.read_text().strip() if failed.is_file() else "it was never built"
    pytest.skip(f"no TensorFlow 2.15 environment at {TF215} ({why}): `bash scripts/task_envs.sh` builds it")


def env_for(tmp_path: Path, *, logical_cpus: int = 1, **extra: str) -> dict[str, str]:
    """What the agent gives a task: the runtime set's copy on the path, none of this checkout or its venv."""
    env = task_env(tmp_path / "job", legacy=False, logical_cpus=logical_cpus, **extra)
    env["PYTHONPATH"] = os.pathsep.join(runtime_pythonpath(tmp_path / "agent"))
    env.pop("VIRTUAL_ENV", None)
    return env


def train_lines(task: Task) -> list[dict]:
    """The callback's train windows (a process's own CPU share comes on lines of its own: worker_pace.py)."""
    return [line for line in task.of_kind("metric", "train") if "loss" in line["metrics"]]


def test_the_builtin_program_trains_and_reports_under_mirrored(tmp_path: Path, python: Path) -> None:
    argv = [str(python), "-u", "-m", "worker_agent.runtime", "--program", "digits_mlp", "--config-json", "{}"]
    with tasks() as start:
        task = start("mirrored", argv, env_for(tmp_path, logical_cpus=2), tmp_path)
        assert task.wait(RUN_TIMEOUT_S) == 0, task.output()[-4000:]

    facts = task.facts()
    assert (facts["tf_version"], facts["keras"], facts["strategy"]) == ("2.15.1", "keras2", "MirroredStrategy")
    assert (facts["replicas_in_sync"], facts["global_batch"]) == (2, 64)
    assert not task.bad_lines and len(task.of_kind("facts")) == 1  # the hook added no second callback
    ends = task.epoch_ends()
    assert [e["epoch"] for e in ends] == [1, 2, 3, 4, 5]
    assert ends[-1]["metrics"]["val_accuracy"] >= 0.90
    for line in train_lines(task):
        assert {"loss", "accuracy", "examples_per_s", "learning_rate"} <= set(line["metrics"])
    (artifact,) = task.of_kind("artifact")
    assert artifact["name"] == "model.keras" and Path(artifact["path"]).is_file()


def test_a_users_fit_under_multi_worker_mirrored_reports_through_the_hook(tmp_path: Path, python: Path) -> None:
    # Keras 2's fit works under MultiWorkerMirrored without TF_USE_LEGACY_KERAS (Keras 3's does not).
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    with tasks() as start:
        workers = [
            start(
                f"worker-{index}",
                [str(python), "-u", str(PROGRAMS / "mwms_fit.py"), "--epochs", "3"],
                env_for(tmp_path / f"w{index}", TF_CONFIG=tf_config(cluster, "worker", index)),
                tmp_path,
            )
            for index in range(2)
        ]
        codes = wait_all(workers, RUN_TIMEOUT_S)
        assert codes == {"worker-0": 0, "worker-1": 0}, describe(workers)

    for worker in workers:
        facts = worker.facts()
        assert (facts["source"], facts["keras"], facts["workers"]) == ("injected", "keras2", 2)
        assert (facts["replicas_in_sync"], facts["global_batch"]) == (2, 64)
        assert [e["epoch"] for e in worker.epoch_ends()] == [1, 2, 3]
        lines = train_lines(worker)
        assert lines, describe([worker])
        for line in lines:  # Keras 2 sums a step's logs over the workers: the callback turns them into means
            assert 0 <= line["metrics"]["accuracy"] <= 1
            assert line["metrics"]["examples_per_s"] > 0


def test_a_users_fit_under_mirrored_and_a_custom_loop_report(tmp_path: Path, python: Path) -> None:
    fit = tmp_path / "fit.py"
    fit.write_text(
        textwrap.dedent(
            """
            import numpy as np
            import tensorflow as tf

            rng = np.random.default_rng(0)
            x = rng.normal(size=(4096, 20)).astype("float32")
            y = (x.sum(axis=1) > 0).astype("int64")
            strategy = tf.distribute.MirroredStrategy()
            print("replicas", strategy.num_replicas_in_sync, flush=True)
            with strategy.scope():
                model = tf.keras.Sequential(
                    [tf.keras.Input((20,)), tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(2)]
                )
                model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                              metrics=["accuracy"])
            model.fit(x, y, batch_size=64, epochs=2, verbose=2)
            """
        )
    )
    loop = tmp_path / "loop.py"
    loop.write_text(
        textwrap.dedent(
            """
            import importlib.util
            from worker_agent import report

            for step in (10, 20):
                report(step, loss=1.0 / step)
            print("protocol reachable:", importlib.util.find_spec("contracts.protocol") is not None, flush=True)
            """
        )
    )
    with tasks() as start:
        fitting = start("fit", [str(python), "-u", str(fit)], env_for(tmp_path, logical_cpus=2), tmp_path)
        looping = start("loop", [str(python), "-u", str(loop)], env_for(tmp_path), tmp_path)
        assert wait_all([fitting, looping], RUN_TIMEOUT_S) == {"fit": 0, "loop": 0}, describe([fitting, looping])

    assert "replicas 2" in fitting.output()
    facts = fitting.facts()
    assert (facts["keras"], facts["strategy"], facts["replicas_in_sync"], facts["global_batch"]) == (
        "keras2",
        "MirroredStrategy",
        2,
        64,
    )
    assert [e["step"] for e in fitting.epoch_ends()] == [64, 128]
    assert train_lines(fitting)
    assert [(e["step"], e["metrics"]["loss"]) for e in train_lines(looping)] == [(10, 0.1), (20, 0.05)]
    assert "protocol reachable: False" in looping.output()  # nothing of the agent beyond the runtime set
