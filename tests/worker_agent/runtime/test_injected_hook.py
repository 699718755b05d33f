"""The injected hook: an unmodified user script's `model.fit` reports metrics, for Keras 3 and for tf_keras.

Every script here is written as a user would write it and imports nothing of ours (except the custom loop, which
uses the public `from worker_agent import report`). They run as the agent runs them: hooks/ first on PYTHONPATH, so
sitecustomize is loaded, and a metrics pipe named by TFDASH_METRICS_FD.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.processes import ROOT
from tests.worker_agent.runtime._tasks import HOOKS, Task, task_env

TF_TIMEOUT_S = 120


def run_script(tmp_path: Path, name: str, source: str, env: dict[str, str]) -> Task:
    script = tmp_path / name
    script.write_text(textwrap.dedent(source))
    task = Task(name, [sys.executable, "-u", str(script)], env, cwd=tmp_path)
    code = task.wait(TF_TIMEOUT_S)
    assert code == 0, f"{name} failed ({code}):\n{task.output()[-4000:]}"
    assert not task.bad_lines
    return task


def plain_env(tmp_path: Path, *extra_path: Path) -> dict[str, str]:
    env = task_env(tmp_path / "job", legacy=False)
    env["PYTHONPATH"] = os.pathsep.join([str(HOOKS), *map(str, extra_path), str(ROOT)])
    return env


def test_the_hook_patches_fit_only_when_keras_is_imported_and_keeps_the_users_callbacks(tmp_path: Path) -> None:
    # A stand-in `keras` package (found before the real one) shows what the hook does to fit's arguments, fast.
    fake = tmp_path / "fake"
    (fake / "keras").mkdir(parents=True)
    (fake / "keras" / "__init__.py").write_text(
        textwrap.dedent(
            """
            from keras import callbacks

            class Model:
                def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, **kwargs):
                    return callbacks
            """
        )
    )
    (fake / "keras" / "callbacks.py").write_text(
        textwrap.dedent(
            """
            class Callback:
                def __init__(self):
                    self.params, self.model = {}, None

            class CallbackList:
                def __init__(self, callbacks):
                    self.callbacks = callbacks
            """
        )
    )
    source = """
        import json, sys
        before = sorted(m for m in ("keras", "tf_keras", "tensorflow") if m in sys.modules)
        import keras

        class Mine(keras.callbacks.Callback):
            pass

        def names(callbacks):
            return [type(c).__name__ for c in callbacks]

        model = keras.Model()
        ours = model.fit([1.0, 2.0])[-1]
        given = keras.callbacks.CallbackList([])
        print(json.dumps({
            "before": before,
            "none": names(model.fit([1.0])),
            "keyword": names(model.fit([1.0], callbacks=[Mine()])),
            "positional": names(model.fit([1.0], None, 8, 1, 0, (Mine(),))),
            "already": names(model.fit([1.0], callbacks=[ours])),
            "callback_list_untouched": model.fit(callbacks=given) is given,
            "examples_per_step": [ours.examples_per_step, model.fit([1.0], batch_size=8)[-1].examples_per_step],
            "loader": type(keras.__spec__.loader).__name__ == type(keras.__loader__).__name__ != "_PatchingLoader",
        }))
    """
    task = run_script(tmp_path, "fake_keras.py", source, plain_env(tmp_path, fake))
    result = json.loads(task.output().splitlines()[-1])
    assert result["before"] == []  # sitecustomize imported no Keras nor TensorFlow by itself
    assert result["none"] == ["TfdashMetrics"]
    assert result["keyword"] == ["Mine", "TfdashMetrics"]
    assert result["positional"] == ["Mine", "TfdashMetrics"]
    assert result["already"] == ["TfdashMetrics"]
    assert result["callback_list_untouched"] is True
    assert result["examples_per_step"] == [32, 8]  # arrays: Keras' default batch, or the one given
    assert result["loader"] is True  # the real loader was put back on the module


def test_a_script_that_imports_nothing_of_keras_runs_unchanged_and_pays_nothing(tmp_path: Path) -> None:
    source = """
        import sys
        print(sorted(m for m in ("keras", "tf_keras", "tensorflow", "worker_agent") if m in sys.modules))
    """
    task = run_script(tmp_path, "plain.py", source, plain_env(tmp_path))
    assert task.output().splitlines()[-1] == "[]"
    assert task.events == []


def metric_lines(task: Task) -> list[dict]:
    return [e for e in task.of_kind("metric") if e["phase"] == "train"]


def test_keras3_user_script_reports_through_the_hook(tmp_path: Path) -> None:
    source = """
        import numpy as np
        import keras

        rng = np.random.default_rng(0)
        x = rng.normal(size=(8192, 20)).astype("float32")
        y = (x.sum(axis=1) > 0).astype("int64")

        class Mine(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                print(f"user callback: epoch {epoch} loss {logs['loss']:.4f}", flush=True)

        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        model.fit(x, y, batch_size=32, epochs=3, callbacks=[Mine()], verbose=0)
    """
    task = run_script(tmp_path, "keras3_user.py", source, task_env(tmp_path / "job", legacy=False))
    assert task.output().count("user callback: epoch") == 3  # the user's own callback still runs
    facts = task.facts()
    assert (facts["source"], facts["keras"], facts["global_batch"]) == ("injected", "keras3", 32)
    train = metric_lines(task)
    assert train, f"no train lines:\n{task.events}"
    for event in train:
        assert {"loss", "accuracy", "examples_per_s", "step_time_s", "learning_rate"} <= set(event["metrics"])
        assert event["metrics"]["examples_per_s"] > 0
    waits = [e["metrics"]["input_wait_fraction"] for e in train if "input_wait_fraction" in e["metrics"]]
    assert waits and all(0 <= w <= 1 for w in waits)  # Keras 3's steps are sampled too (input_wait.py)
    ends = task.epoch_ends()
    assert [e["epoch"] for e in ends] == [1, 2, 3]
    assert [e["step"] for e in ends] == [256, 512, 768]
    assert ends[-1]["metrics"]["accuracy"] > 0.9


def test_tf_keras_user_script_under_mirrored_reports_through_the_hook(tmp_path: Path) -> None:
    # tf.keras with TF_USE_LEGACY_KERAS=1 is tf_keras; the CPU split into 2 logical devices still happens.
    source = """
        import numpy as np
        import tensorflow as tf

        rng = np.random.default_rng(0)
        x = rng.normal(size=(8192, 20)).astype("float32")
        y = (x.sum(axis=1) > 0).astype("int64")
        strategy = tf.distribute.MirroredStrategy()
        print("replicas", strategy.num_replicas_in_sync, flush=True)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(8192, seed=1).batch(64).prefetch(2)
        with strategy.scope():
            model = tf.keras.Sequential(
                [tf.keras.Input((20,)), tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(2)]
            )
            model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"])
        model.fit(dataset, epochs=3, verbose=2)
    """
    task = run_script(tmp_path, "tf_keras_user.py", source, task_env(tmp_path / "job", legacy=True, logical_cpus=2))
    assert "replicas 2" in task.output()
    facts = task.facts()
    assert (facts["keras"], facts["strategy"], facts["replicas_in_sync"]) == ("tf_keras", "MirroredStrategy", 2)
    assert facts["global_batch"] == 64  # read from the pipeline's batch step
    train = metric_lines(task)
    assert train, f"no train lines:\n{task.events}"
    for event in train:
        assert {"loss", "accuracy", "examples_per_s"} <= set(event["metrics"])
        assert 0 <= event["metrics"]["accuracy"] <= 1
    waits = [e["metrics"]["input_wait_fraction"] for e in train if "input_wait_fraction" in e["metrics"]]
    assert waits and all(0 <= w <= 1 for w in waits)  # sampled steps on 2 replicas' batches (input_wait.py)
    ends = task.epoch_ends()
    assert [e["step"] for e in ends] == [128, 256, 384]
    assert ends[-1]["metrics"]["accuracy"] > 0.9


def test_a_custom_loop_reports_with_the_public_function(tmp_path: Path) -> None:
    source = """
        from worker_agent import report

        loss = 2.0
        for step in range(1, 101):
            loss *= 0.97
            if step % 25 == 0:
                report(step, loss=loss, examples_per_s=1234.5)
        report(100, epoch=1, phase="epoch_end", val_loss=loss)
        print("trained", flush=True)
    """
    task = run_script(tmp_path, "custom_loop.py", source, task_env(tmp_path / "job"))
    lines = task.of_kind("metric")
    expected = [(25, "train"), (50, "train"), (75, "train"), (100, "train"), (100, "epoch_end")]
    assert [(e["step"], e["phase"]) for e in lines] == expected
    assert lines[0]["metrics"]["examples_per_s"] == 1234.5

    # The same script outside the product: it runs, and says once that report() does nothing.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFDASH_")}
    outside = subprocess.run(
        [sys.executable, str(tmp_path / "custom_loop.py")],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert outside.returncode == 0
    assert outside.stdout.strip() == "trained"
    assert outside.stderr.count("report() does nothing here") == 1
