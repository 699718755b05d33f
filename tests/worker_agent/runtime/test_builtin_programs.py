"""The builtin programs under each strategy, as real TF processes on loopback with hand-written TF_CONFIGs.

`python -m worker_agent.runtime --program digits_mlp` must reach 0.90 validation accuracy under Mirrored (2 logical
CPU devices), MultiWorkerMirrored (2 workers) and ParameterServer (chief + 2 workers + 1 ps); every task's metric
lines must arrive on its own pipe; the facts must follow the batch and learning-rate rules; a MultiWorkerMirrored
gang killed mid-run must resume from its last completed epoch. One distributed job at a time: this machine has 2 cores.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_ports
from tests.support.processes import wait_until
from tests.worker_agent.runtime._tasks import (
    Task,
    describe,
    runtime_argv,
    task_env,
    tasks,
    tf_config,
    wait_all,
)

RUN_TIMEOUT_S = 240


def last_val_accuracy(task: Task) -> float:
    ends = task.epoch_ends()
    assert ends, f"{task.name} sent no epoch_end line:\n{task.output()[-3000:]}"
    return ends[-1]["metrics"]["val_accuracy"]


def assert_trains_with_metrics(task: Task, epochs: int, examples_per_step: int, accuracy_slack: float = 0.0) -> None:
    """`accuracy_slack`: how far above 1 a batch's accuracy may read (see the ParameterServer test)."""
    assert not task.bad_lines
    assert len(task.of_kind("facts")) == 1  # the runtime's callback only: the injected hook added no second one
    ends = task.epoch_ends()
    assert [e["epoch"] for e in ends] == list(range(1, epochs + 1))
    for end in ends:
        assert {"loss", "accuracy", "val_loss", "val_accuracy", "learning_rate", "epoch_time_s"} <= set(end["metrics"])
    # Besides the callback's windows (their loss), each process of a distributed job sends its own CPU share, and a
    # ParameterServer chief each worker's pace, on lines of their own (worker_agent/runtime/worker_pace.py).
    train = [line for line in task.of_kind("metric", "train") if "loss" in line["metrics"]]
    assert train, f"{task.name} sent no train lines"
    for line in train:
        metrics = line["metrics"]
        assert {"loss", "accuracy", "examples_per_s", "step_time_s", "learning_rate"} <= set(metrics)
        # Per-batch logs are means over the replicas, not their sum (a sum reads about N times too high).
        assert 0 <= metrics["accuracy"] <= 1 + accuracy_slack
        assert metrics["examples_per_s"] == pytest.approx(examples_per_step / metrics["step_time_s"])
    steps = [e["step"] for e in task.of_kind("metric") if "loss" in e["metrics"]]
    assert steps == sorted(steps)


def assert_model_artifact(task: Task, job: Path) -> None:
    (artifact,) = task.of_kind("artifact")
    path = job / "artifacts" / "model.keras"
    assert (artifact["name"], artifact["path"]) == ("model.keras", str(path))
    with zipfile.ZipFile(path) as archive:  # one file: the Keras v3 format is a zip
        assert {"config.json", "model.weights.h5"} <= set(archive.namelist())


def check_facts(facts: dict[str, Any], **expected: Any) -> None:
    assert {key: facts.get(key) for key in expected} == expected


def test_mirrored_on_two_logical_cpu_devices(tmp_path: Path) -> None:
    job = tmp_path / "job"
    with tasks() as start:
        task = start("mirrored", runtime_argv("digits_mlp", {}), task_env(job, logical_cpus=2), tmp_path)
        assert task.wait(RUN_TIMEOUT_S) == 0, task.output()[-4000:]

    check_facts(
        task.facts(),
        strategy="MirroredStrategy",
        keras="tf_keras",
        replicas_in_sync=2,
        workers=1,
        devices_per_machine=2,
        global_batch=64,
        machine_batch=64,
        per_device_batch=32,
        base_learning_rate=0.001,
        effective_learning_rate=0.002,
        steps_per_epoch=1438 // 64,
        checkpoint_dir=str(job / "checkpoints"),
        resumed_from_epoch=0,
    )
    assert_trains_with_metrics(task, epochs=5, examples_per_step=64)
    assert last_val_accuracy(task) >= 0.90
    assert_model_artifact(task, job)
    assert "replicas in sync 2 = 1 machine(s) x 2 device(s)" in task.output()
    assert not any((job / "checkpoints").iterdir())  # the backup is deleted once fit completes


def test_keras3_mirrored_trains_the_cnn_with_a_warmup(tmp_path: Path) -> None:
    # Without TF_USE_LEGACY_KERAS, `tf.keras` is Keras 3, which is fine for a single machine.
    job = tmp_path / "job"
    config = {"epochs": 3, "warmup_epochs": 1, "learning_rate": 0.002}
    with tasks() as start:
        task = start(
            "keras3", runtime_argv("digits_cnn", config), task_env(job, legacy=False, logical_cpus=2), tmp_path
        )
        assert task.wait(RUN_TIMEOUT_S) == 0, task.output()[-4000:]

    facts = task.facts()
    check_facts(facts, keras="keras3", program="digits_cnn", replicas_in_sync=2, warmup_steps=22)
    assert facts["effective_learning_rate"] == pytest.approx(0.004)
    schedule = dict(facts["lr_schedule"])
    assert (schedule[0], schedule[11], schedule[22]) == pytest.approx((0.002, 0.003, 0.004))
    ends = task.epoch_ends()
    assert [round(e["metrics"]["learning_rate"], 6) for e in ends] == [0.004] * 3  # warm-up ends with epoch 1
    assert last_val_accuracy(task) >= 0.90
    assert_model_artifact(task, job)


def mwms_cluster() -> dict[str, list[str]]:
    return {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}


def start_mwms(start: Any, job: Path, config: dict[str, Any], cwd: Path, label: str = "") -> list[Task]:
    cluster = mwms_cluster()
    argv = runtime_argv("digits_mlp", config)
    return [
        start(f"{label}worker-{i}", argv, task_env(job, TF_CONFIG=tf_config(cluster, "worker", i)), cwd)
        for i in range(2)
    ]


def test_multi_worker_mirrored_with_two_workers(tmp_path: Path) -> None:
    job = tmp_path / "job"
    with tasks() as start:
        workers = start_mwms(start, job, {"epochs": 4}, tmp_path)
        codes = wait_all(workers, RUN_TIMEOUT_S)
        assert codes == {"worker-0": 0, "worker-1": 0}, describe(workers)

    for index, worker in enumerate(workers):
        check_facts(
            worker.facts(),
            strategy="MultiWorkerMirroredStrategy",
            role="worker",
            task_index=index,
            is_chief=index == 0,
            replicas_in_sync=2,
            workers=2,
            global_batch=64,
            machine_batch=32,
            per_device_batch=32,
            effective_learning_rate=0.002,
            resumed_from_epoch=0,
        )
        assert_trains_with_metrics(worker, epochs=4, examples_per_step=32)  # each worker computes half a step
        assert last_val_accuracy(worker) >= 0.90
    assert_model_artifact(workers[0], job)
    assert workers[1].of_kind("artifact") == []  # only the chief publishes the model
    assert not (job / "checkpoints-tmp" / "worker-1").exists()  # worker 1's save went to a scratch folder, removed


def test_parameter_server_with_chief_two_workers_and_a_ps(tmp_path: Path) -> None:
    job = tmp_path / "job"
    ports = free_ports(4)
    cluster = {
        "chief": [f"127.0.0.1:{ports[0]}"],
        "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"],
        "ps": [f"127.0.0.1:{ports[3]}"],
    }
    argv = runtime_argv("digits_mlp", {"epochs": 4})
    with tasks() as start:
        group = [
            start(f"{kind}-{i}", argv, task_env(job, TF_CONFIG=tf_config(cluster, kind, i)), tmp_path)
            for kind, i in (("ps", 0), ("worker", 0), ("worker", 1), ("chief", 0))
        ]
        chief = group[-1]
        assert wait_all([chief], RUN_TIMEOUT_S) == {"chief-0": 0}, describe(group)
        servers = group[:3]
        assert all(s.proc.poll() is None for s in servers), describe(group)  # they serve until killed

    # Each step runs whole on one worker (TF's PS has one worker's devices in sync): global 32, no LR scaling.
    check_facts(
        chief.facts(),
        strategy="ParameterServerStrategy",
        role="chief",
        is_chief=True,
        replicas_in_sync=1,
        workers=2,
        global_batch=32,
        machine_batch=32,
        effective_learning_rate=0.001,
        steps_per_epoch=1438 // 32,
        resumed_from_epoch=0,
    )
    # The coordinator accounts for every step. A batch's accuracy is read there as total / count of metric variables
    # on the ps, which both workers update concurrently: a read between another worker's two updates can come out
    # slightly above 1 (1.008 seen in a stressed CI run); a sum over the two workers would read near 2.
    assert_trains_with_metrics(chief, epochs=4, examples_per_step=32, accuracy_slack=0.1)
    assert last_val_accuracy(chief) >= 0.90
    assert_model_artifact(chief, job)
    for server in servers:
        facts = server.facts()
        assert (facts["role"], facts["strategy"]) == (server.name.split("-")[0], "ParameterServerStrategy")
        assert facts["serving"] in cluster[facts["role"]]
        # The chief's loop reports the training; a server says only how busy its process is (the slow worker's
        # host notes).
        assert {name for line in server.of_kind("metric") for name in line["metrics"]} <= {"process_cpu_percent"}


def test_multi_worker_mirrored_resumes_a_killed_gang_at_its_last_completed_epoch(tmp_path: Path) -> None:
    job = tmp_path / "job"
    config = {"epochs": 6, "steps_per_epoch": 8}
    with tasks() as start:
        first = start_mwms(start, job, config, tmp_path, label="run1-")
        wait_until(
            lambda: (
                any(e["epoch"] >= 2 for e in first[0].epoch_ends()) or any(w.proc.poll() is not None for w in first)
            ),
            RUN_TIMEOUT_S,
            what="worker 0 to finish its second epoch",
        )
        for worker in first:
            worker.kill()  # SIGKILL to each process group, as a crash or the agent's cancel does
        done = max(e["epoch"] for e in first[0].epoch_ends())
        assert 2 <= done < 6, describe(first)
        assert (job / "checkpoints" / "chief").is_dir()

        second = start_mwms(start, job, config, tmp_path, label="run2-")
        codes = wait_all(second, RUN_TIMEOUT_S)
        assert set(codes.values()) == {0}, describe(second)

    resumed = {w.facts()["resumed_from_epoch"] for w in second}
    assert len(resumed) == 1, resumed  # both workers restored the same checkpoint
    (epoch,) = resumed
    # The backup of an epoch is written before its epoch_end line, so the kill may have caught one more backup.
    assert done <= epoch <= done + 1
    for worker in second:
        assert [e["epoch"] for e in worker.epoch_ends()] == list(range(epoch + 1, 7))
        assert worker.epoch_ends()[0]["step"] == (epoch + 1) * 8
    # The weights came back too, not only the epoch counter: the loss goes on from where it was.
    first_loss = first[0].epoch_ends()[0]["metrics"]["loss"]
    resumed_loss = second[0].epoch_ends()[0]["metrics"]["loss"]
    print(f"run 1: {done} epochs seen, first loss {first_loss:.3f}; run 2: resumed at {epoch}, loss {resumed_loss:.3f}")
    assert resumed_loss < 0.5 * first_loss, (first_loss, resumed_loss)
    assert "resumed from epoch" in second[0].output()
    assert_model_artifact(second[0], job)
