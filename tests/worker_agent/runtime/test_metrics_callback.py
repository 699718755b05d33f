"""The emitter, the metrics callback's logic and `report()`, driven by hand (no TensorFlow, no Keras).

The callback is built on a stand-in base class and fed the hooks Keras would call, with a fake clock, so the
throttle, the step axis and the line contents are checked exactly; the real Keras runs are in the other files.
"""

from __future__ import annotations

import importlib
import itertools
import json
import math
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from worker_agent.runtime import emitter as emitter_module
from worker_agent.runtime.emitter import Emitter
from worker_agent.runtime.metrics import metrics_callback_class

report_module = importlib.import_module("worker_agent.report")  # `worker_agent.report` the attribute is the function


class StandInCallback:
    """What Keras' Callback gives ours: `params` and `model`, set by Keras before training."""

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}
        self.model: Any = None


class Optimizer:
    def __init__(self, rate: Any) -> None:
        self.learning_rate = rate
        self.iterations = 7


class Model:
    def __init__(self, rate: Any = 0.002) -> None:
        self.optimizer = Optimizer(rate)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[tuple[Emitter, Path]]:
    path = tmp_path / "metrics.jsonl"
    emitter = Emitter(path.open("w", buffering=1))
    yield emitter, path
    emitter.close()


def make_callback(emitter: Emitter, clock: Clock, steps: int | None = 100, epochs: int = 3, **kwargs: Any) -> Any:
    cls = metrics_callback_class(StandInCallback)
    callback = cls(emitter=emitter, clock=clock, **kwargs)
    callback.params = {"steps": steps, "epochs": epochs}
    callback.model = Model()
    return callback


def run_epoch(
    callback: Any, clock: Clock, epoch: int, steps: int, step_s: float, logs: dict[str, Any], first: int = 0
) -> None:
    """Keras' hooks for one epoch; `first`: the step it begins at (a fit resumed from a mid-epoch backup)."""
    callback.on_epoch_begin(epoch)
    for batch in range(first, steps):
        callback.on_train_batch_begin(batch)
        clock.now += step_s
        callback.on_train_batch_end(batch, logs)
    callback.on_epoch_end(epoch, {**logs, "val_loss": 0.5, "val_accuracy": 0.9})


def test_train_lines_are_throttled_to_the_window_and_epoch_end_lines_always_come(sink: tuple[Emitter, Path]) -> None:
    emitter, path = sink
    clock = Clock()
    callback = make_callback(emitter, clock, steps=40, examples_per_step=64, facts={"global_batch": 64})
    callback.on_train_begin()
    for epoch in range(2):
        run_epoch(callback, clock, epoch, steps=40, step_s=0.0625, logs={"loss": 1.5, "accuracy": 0.5})
    callback.on_train_end()

    events = lines(path)
    assert events[0]["kind"] == "facts"
    # The fit's length as Keras tells callbacks, for the job's progress and ETA.
    resumed = {"resumed_from_epoch": 0, "resumed_from_step": 0}
    assert events[0]["facts"] == {"epochs": 3, "steps_per_epoch": 40, "global_batch": 64, **resumed}
    train = [e for e in events if e["kind"] == "metric" and e["phase"] == "train"]
    ends = [e for e in events if e["kind"] == "metric" and e["phase"] == "epoch_end"]
    # 2.5 s of 1/16 s steps per epoch, 0.5 s windows (8 steps). The first epoch's first window opens after its first
    # step (tracing is not training), and its 7-step tail is too close to the last line to be sent; the second
    # epoch's first window opens at the epoch's start.
    expected = [(1, 9), (1, 17), (1, 25), (1, 33), (2, 48), (2, 56), (2, 64), (2, 72), (2, 80)]
    assert [(e["epoch"], e["step"]) for e in train] == expected
    for event in train:
        metrics = event["metrics"]
        assert metrics["step_time_s"] == pytest.approx(0.0625)
        assert metrics["examples_per_s"] == pytest.approx(64 / 0.0625)
        assert metrics["learning_rate"] == pytest.approx(0.002)
        assert (metrics["loss"], metrics["accuracy"]) == (1.5, 0.5)
        assert event["ts"] > 1e9 and event["mono"] > 0
    assert [(e["epoch"], e["step"]) for e in ends] == [(1, 40), (2, 80)]
    assert ends[0]["metrics"]["val_accuracy"] == 0.9
    assert ends[0]["metrics"]["epoch_time_s"] == pytest.approx(2.5)
    assert ends[0]["metrics"]["learning_rate"] == pytest.approx(0.002)


def test_epochs_shorter_than_a_window_still_report_throughput_at_the_same_rate(sink: tuple[Emitter, Path]) -> None:
    emitter, path = sink
    clock = Clock()
    callback = make_callback(emitter, clock, steps=4, epochs=8, examples_per_step=10)
    callback.on_train_begin()
    sent_at = []
    for epoch in range(8):
        before = len(lines(path))
        run_epoch(callback, clock, epoch, steps=4, step_s=0.0625, logs={"loss": 1.0})  # 0.25 s epochs
        clock.now += 0.125  # validation
        if any(e["phase"] == "train" for e in lines(path)[before:]):
            sent_at.append(clock.now)
    train = [e for e in lines(path) if e["phase"] == "train"]
    assert [e["epoch"] for e in train] == [1, 3, 5, 7]  # every other epoch: never closer than 0.5 s
    assert all(b - a >= 0.5 for a, b in itertools.pairwise(sent_at))
    for event in train:
        assert event["step"] % 4 == 0  # sent at an epoch's end, for that epoch's steps
        assert event["metrics"]["examples_per_s"] == pytest.approx(10 / 0.0625)


def test_a_resumed_run_continues_the_step_axis_and_says_where_it_resumed(sink: tuple[Emitter, Path]) -> None:
    emitter, path = sink
    clock = Clock()
    started: list[tuple[int, int]] = []
    callback = make_callback(emitter, clock, steps=10, epochs=5, facts={}, on_start=lambda *at: started.append(at))
    callback.on_train_begin()
    run_epoch(callback, clock, 3, steps=10, step_s=0.01, logs={"loss": 0.1})
    events = lines(path)
    assert (events[0]["facts"]["resumed_from_epoch"], events[0]["facts"]["resumed_from_step"]) == (3, 0)
    assert started == [(3, 0)]
    assert (events[-1]["epoch"], events[-1]["step"]) == (4, 40)


def test_a_run_resumed_mid_epoch_says_the_step_it_went_on_from(sink: tuple[Emitter, Path]) -> None:
    emitter, path = sink
    clock = Clock()
    started: list[tuple[int, int]] = []
    callback = make_callback(emitter, clock, steps=10, epochs=5, facts={}, on_start=lambda *at: started.append(at))
    callback.on_train_begin()
    run_epoch(callback, clock, 3, steps=10, step_s=0.01, logs={"loss": 0.1}, first=7)  # 7 steps of epoch 4 done
    events = lines(path)
    assert (events[0]["facts"]["resumed_from_epoch"], events[0]["facts"]["resumed_from_step"]) == (3, 7)
    assert started == [(3, 7)]
    assert (events[-1]["phase"], events[-1]["epoch"], events[-1]["step"]) == ("epoch_end", 4, 40)


def test_a_run_resumed_after_its_last_epoch_still_sends_its_facts(sink: tuple[Emitter, Path]) -> None:
    emitter, path = sink
    callback = make_callback(emitter, Clock(), steps=None, epochs=5, facts={"x": 1, "epochs": 6})
    callback.on_train_begin()
    callback.on_train_end()
    # The facts' own epochs win over Keras' params; unknown steps per epoch are left out.
    facts = {"x": 1, "epochs": 6, "resumed_from_epoch": 5, "resumed_from_step": 0}
    assert lines(path) == [{"kind": "facts", "ts": pytest.approx(lines(path)[0]["ts"]), "facts": facts}]


def test_unknown_epoch_length_counts_steps_as_they_come(sink: tuple[Emitter, Path]) -> None:
    emitter, path = sink
    clock = Clock()
    callback = make_callback(emitter, clock, steps=None, step_offset=1000)
    callback.on_train_begin()
    run_epoch(callback, clock, 0, steps=30, step_s=0.1, logs={"loss": 1.0})
    run_epoch(callback, clock, 1, steps=30, step_s=0.1, logs={"loss": 1.0})
    steps = [e["step"] for e in lines(path)]
    assert steps == sorted(steps)
    train = [e["step"] for e in lines(path) if e["phase"] == "train"]
    assert len(set(train)) == len(train)
    assert [e["step"] for e in lines(path) if e["phase"] == "epoch_end"] == [1030, 1060]


def test_a_learning_rate_schedule_is_read_at_the_current_step(sink: tuple[Emitter, Path]) -> None:
    emitter, path = sink
    callback = make_callback(emitter, Clock())
    callback.model = Model(rate=lambda step: 0.001 * step)  # iterations = 7
    callback.on_train_begin()
    callback.on_epoch_begin(0)
    callback.on_epoch_end(0, {"loss": 1.0})
    assert lines(path)[-1]["metrics"]["learning_rate"] == pytest.approx(0.007)


def test_values_that_are_not_finite_numbers_are_dropped(sink: tuple[Emitter, Path]) -> None:
    emitter, path = sink
    assert emitter.metric(1, {"loss": math.nan, "acc": math.inf, "name": "x", "ok": 2, "flag": True, "v": None})
    assert lines(path)[0]["metrics"] == {"ok": 2.0}
    assert not emitter.metric(2, {"loss": math.nan})  # nothing left to say: no line
    assert emitter.facts({"bad": math.nan}) is False  # a NaN in facts drops that line, and only that line
    assert emitter.facts({"good": 1})
    assert [e["kind"] for e in lines(path)] == ["metric", "facts"]


def test_a_failing_hook_disables_the_callback_instead_of_the_training(
    sink: tuple[Emitter, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    emitter, path = sink
    clock = Clock()
    callback = make_callback(emitter, clock)
    callback.params = {"steps": "many"}
    callback.on_train_begin()
    callback.on_epoch_begin(0)
    for batch in range(100):
        clock.now += 0.1
        callback.on_train_batch_end(batch, {"loss": 1.0})  # raises inside; must not escape
    callback.on_epoch_end(0, {"loss": 1.0})
    assert "metrics callback disabled after an error in _batch_end_window" in capsys.readouterr().err
    assert lines(path) == []


def test_a_broken_pipe_turns_the_emitter_off_without_raising(capsys: pytest.CaptureFixture[str]) -> None:
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the agent is gone
    emitter = Emitter(os.fdopen(write_fd, "w", buffering=1), origin="test")
    assert emitter.metric(1, {"loss": 1.0}) is False
    assert not emitter.enabled
    assert emitter.metric(2, {"loss": 1.0}) is False
    assert "metrics are off for the rest of this run" in capsys.readouterr().err
    emitter.close()


@pytest.fixture
def metrics_pipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """TFDASH_METRICS_FD names a fresh pipe's write end; yields the read end; the process emitter is reset around."""
    read_fd, write_fd = os.pipe()
    monkeypatch.setenv("TFDASH_METRICS_FD", str(write_fd))
    monkeypatch.setattr(emitter_module, "_emitter", None)
    yield read_fd
    emitter_module.get_emitter().close()  # closes the write end
    os.close(read_fd)


def read_lines(read_fd: int) -> list[dict[str, Any]]:
    emitter_module.get_emitter().close()
    with os.fdopen(os.dup(read_fd), "r") as pipe:
        return [json.loads(line) for line in pipe]


def test_report_writes_a_metric_line(metrics_pipe: int) -> None:
    from worker_agent import report

    report(12, loss=0.5, examples_per_s=1000)
    report(20, epoch=2, phase="epoch_end", val_loss=0.25)
    first, second = read_lines(metrics_pipe)
    assert first["kind"] == "metric" and first["phase"] == "train" and first["epoch"] is None
    assert (first["step"], first["metrics"]) == (12, {"loss": 0.5, "examples_per_s": 1000.0})
    assert (second["step"], second["epoch"], second["phase"], second["metrics"]) == (
        20,
        2,
        "epoch_end",
        {"val_loss": 0.25},
    )


def test_report_and_a_callback_never_interleave_lines(metrics_pipe: int) -> None:
    from worker_agent import report

    # 4 threads x 300 lines of ~2 KiB: far beyond the pipe buffer and PIPE_BUF, read concurrently.
    collected: list[str] = []
    reader = threading.Thread(target=lambda: collected.extend(os.fdopen(os.dup(metrics_pipe), "r")), daemon=True)
    reader.start()
    names = {f"metric_{i:03d}": float(i) for i in range(100)}

    def writer(offset: int) -> None:
        for step in range(300):
            report(offset + step, **names)

    threads = [threading.Thread(target=writer, args=(k * 1000,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    emitter_module.get_emitter().close()
    reader.join(timeout=10)
    events = [json.loads(line) for line in collected]
    assert len(events) == 1200
    assert all(event["metrics"] == names for event in events)


def test_report_without_a_pipe_does_nothing_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TFDASH_METRICS_FD", raising=False)
    monkeypatch.setattr(emitter_module, "_emitter", None)
    monkeypatch.setattr(report_module, "_warned", False)
    report_module.report(1, loss=1.0)
    report_module.report(2, loss=1.0)
    assert capsys.readouterr().err.count("report() does nothing here: TFDASH_METRICS_FD is not set") == 1
    monkeypatch.setattr(emitter_module, "_emitter", None)


def test_a_bad_fd_turns_metrics_off_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TFDASH_METRICS_FD", "not-a-number")
    assert Emitter.from_env().enabled is False
    assert "is not a writable file descriptor" in capsys.readouterr().err
