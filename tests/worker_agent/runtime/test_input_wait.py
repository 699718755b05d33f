"""input_wait.py without TensorFlow: which steps are sampled, what is recorded, and the window's share."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from worker_agent.runtime.input_wait import SAMPLE_GAP_S, InputWaitRecorder, SampledTrainFunction, wait_fraction


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(every: int = 0, waited: float = 0.004) -> tuple[SampledTrainFunction, InputWaitRecorder, Clock, list[str]]:
    calls: list[str] = []
    clock = Clock()
    rec = InputWaitRecorder()

    def original(iterator: Any) -> str:
        calls.append("compiled")
        next(iterator)
        return "logs"

    def fetch(iterator: Any) -> tuple[Any, float]:
        calls.append("fetch")
        return next(iterator), waited

    def on_batch(data: Any) -> str:
        calls.append(f"step {data}")
        return "logs"

    return SampledTrainFunction(original, fetch, on_batch, every, clock=clock, rec=rec), rec, clock, calls


def test_it_samples_nothing_while_no_callback_reads_the_samples() -> None:
    function, rec, _clock, calls = make()
    assert function(iter([1])) == "logs"
    assert calls == ["compiled"] and rec.snapshot() == (0.0, 0)


def test_it_samples_a_step_per_gap_and_leaves_out_the_first_sample_which_traced() -> None:
    function, rec, clock, calls = make()
    rec.start()
    data = itertools.count()
    for _ in range(4):  # the first is sampled (traces: not counted), the rest fall inside the gap
        assert function(data) == "logs"
        clock.now += SAMPLE_GAP_S / 4
    assert calls == ["fetch", "step 0", "compiled", "compiled", "compiled"]
    assert rec.snapshot() == (0.0, 0)
    clock.now += SAMPLE_GAP_S
    function(data)
    assert calls[-2:] == ["fetch", "step 4"]
    assert rec.snapshot() == (pytest.approx(0.004), 1)


def test_synchronous_workers_sample_by_step_count_so_every_worker_samples_the_same_steps() -> None:
    function, rec, clock, calls = make(every=4)
    rec.start()
    data = itertools.count()
    for _ in range(9):
        function(data)
        clock.now += 10.0  # time does not matter
    assert [c for c in calls if c != "compiled"] == ["fetch", "step 0", "fetch", "step 4", "fetch", "step 8"]
    assert rec.snapshot() == (pytest.approx(0.008), 2)


def test_the_end_of_the_data_is_raised_by_a_sampled_step_as_by_keras_own() -> None:
    function, rec, _clock, _calls = make()
    rec.start()
    with pytest.raises(StopIteration):
        function(iter([]))


def test_the_share_is_the_mean_sampled_wait_over_the_windows_step_time() -> None:
    assert wait_fraction((1.0, 10), (1.3, 13), step_time_s=0.2) == pytest.approx(0.5)
    assert wait_fraction((1.0, 10), (1.0, 10), step_time_s=0.2) is None  # no sample in the window
    assert wait_fraction((0.0, 0), (5.0, 1), step_time_s=0.2) == 1.0  # bounded
