"""input_wait.py without TensorFlow: which steps are sampled, what is recorded, and the window's share."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from worker_agent.runtime.input_wait import SAMPLE_GAP_S, InputWaitRecorder, SampledTrainFunction, wait_fraction


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(
    every: int = 0, waited: float = 0.004, draws: list[float] | None = None
) -> tuple[SampledTrainFunction, InputWaitRecorder, Clock, list[str]]:
    calls: list[str] = []
    clock = Clock()
    rec = InputWaitRecorder()
    pending = list(draws or [])

    def original(iterator: Any) -> str:
        calls.append("compiled")
        next(iterator)
        clock.now += 0.01  # a 10 ms step
        return "logs"

    def timed(iterator: Any) -> tuple[str, float]:
        calls.append("fetch")
        calls.append(f"step {next(iterator)}")
        clock.now += 0.01
        return "logs", waited

    function = SampledTrainFunction(original, timed, every, clock=clock, rec=rec, random_source=lambda: pending.pop(0))
    return function, rec, clock, calls


def test_it_samples_nothing_while_no_callback_reads_the_samples() -> None:
    function, rec, _clock, calls = make()
    assert function(iter([1])) == "logs"
    assert calls == ["compiled"] and rec.snapshot() == (0.0, 0)


def test_it_samples_steps_at_random_one_per_gap_of_training_and_leaves_out_the_traces() -> None:
    # 10 ms steps and a 50 ms gap: each step is sampled with chance 0.2. The wrapper draws how many steps away the
    # next sample is (geometric: 1 + floor(log(1 - u) / log(0.8))): u=0.5 -> 4, 0.1 -> 1, 0.9 -> 11.
    assert SAMPLE_GAP_S == 0.05
    function, rec, _clock, calls = make(draws=[0.5, 0.1, 0.9, 0.9])
    rec.start()
    data = itertools.count()
    for _ in range(19):
        function(data)
    assert calls == [
        "fetch", "step 0",  # the first: sampled, traces the fetch and the step, not counted
        "fetch", "step 1",  # no step time known yet: the next is sampled too
        "fetch", "step 2",  # the step time is known from now on: draw 0.5, the 4th call from here is next
        "compiled", "compiled", "compiled",  # the last of them is timed (its first timed call: not counted)
        "fetch", "step 6",  # draw 0.1: the very next call
        "fetch", "step 7",  # draw 0.9: the 11th from here
        *["compiled"] * 10,
        "fetch", "step 18",
    ]  # fmt: skip
    assert rec.snapshot() == (pytest.approx(0.02), 5)


def test_about_one_step_per_gap_of_training_is_sampled_whatever_the_step_time() -> None:
    for step_s, expected_share in ((0.002, 0.04), (0.01, 0.2), (0.05, 1.0), (0.2, 1.0)):
        function, rec, clock, _calls = make()
        function._random = random.Random(7).random  # a seeded stream instead of the test's list
        rec.start()

        def original(iterator: Any, clock: Clock = clock, step_s: float = step_s) -> str:
            clock.now += step_s
            return "logs"

        function.original = original
        for _ in range(20_000):
            function(itertools.count())
        assert rec.steps / 20_000 == pytest.approx(expected_share, rel=0.05), step_s


def test_steps_a_clock_sees_take_no_time_are_timed_again_instead_of_failing_the_training() -> None:
    rec = InputWaitRecorder()
    rec.start()
    function = SampledTrainFunction(lambda _it: "logs", lambda _it: ("logs", 0.0), clock=lambda: 0.0, rec=rec)
    for _ in range(10):
        assert function(itertools.count()) == "logs"
    assert rec.steps == 5  # after the trace and the first counted sample, every other call: timed, then sampled


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
