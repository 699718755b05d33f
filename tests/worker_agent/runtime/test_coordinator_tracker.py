"""The ClusterCoordinator counting, on stand-in remote values (fast; the real TF loop runs in
tests/orchestrator/test_job_host_charts_e2e.py): only functions already done are counted and read, windows are time
throttled, a scalar result is the loss, and Keras' own scheduling is left out."""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest

from worker_agent.runtime import coordinator
from worker_agent.runtime.coordinator import CoordinatorTracker, scalar_results


class Emitter:
    def __init__(self) -> None:
        self.lines: list[tuple[int, dict[str, float]]] = []
        self.facts_lines: list[dict[str, Any]] = []

    def metric(self, step: int, metrics: dict[str, float], *, epoch: int | None = None, phase: str = "train") -> bool:
        self.lines.append((step, dict(metrics)))
        return True

    def facts(self, facts: dict[str, Any]) -> bool:
        self.facts_lines.append(facts)
        return True


class Dtype:
    def __init__(self, floating: bool) -> None:
        self.is_floating = floating


class Tensor:
    """A remote tensor: shape and dtype are known without copying it."""

    def __init__(self, value: Any, shape: tuple[int, ...] = (), floating: bool = True) -> None:
        self.value, self.shape, self.dtype = value, shape, Dtype(floating)


class RemoteValue:
    """As TF's RemoteValueImpl: an event set once the closure's values (or error) are in; fetch() counted."""

    def __init__(self, values: Any = None) -> None:
        self._status_available_event = threading.Event()
        self._status = types.SimpleNamespace(name="NOT_READY")
        self._values: Any = None
        self._error: Exception | None = None
        self._result = values
        self.fetches = 0

    def finish(self, error: Exception | None = None) -> None:
        self._status = types.SimpleNamespace(name="READY")
        self._values, self._error = (None, error) if error else (self._result, None)
        self._status_available_event.set()

    def fetch(self) -> Any:
        assert self._status_available_event.is_set(), "fetched a value that is not done: that waits for training"
        self.fetches += 1
        if isinstance(self._values, dict):
            return {k: v.value for k, v in self._values.items()}
        return self._values.value


def test_only_done_functions_count_windows_are_throttled_and_the_newest_done_scalar_is_the_loss() -> None:
    emitter = Emitter()
    tracker = CoordinatorTracker(emitter, min_interval_s=0.5)  # type: ignore[arg-type]
    values = [RemoteValue(Tensor(1.0 / (i + 1))) for i in range(10)]
    for value in values:
        tracker.scheduled(value)

    values[0].finish()
    tracker.poll(10.0)  # the first done function opens the first window: nothing to report yet
    assert emitter.lines == [] and tracker.done == 1
    values[1].finish()
    values[2].finish()
    tracker.poll(10.3)  # 0.3 s: under the interval
    assert emitter.lines == []
    values[3].finish(error=RuntimeError("worker lost"))  # failed: not a step
    values[5].finish()  # done out of order: counted; 4 is still running and is never read
    tracker.poll(11.0)

    assert emitter.lines == [(4, {"steps_per_s": 3.0, "step_time_s": 1 / 3.0, "loss": 1 / 6})]
    assert values[4].fetches == 0 and values[3].fetches == 0
    assert [v.fetches for v in values[:3]] == [0, 0, 0]  # one value read per window, the newest done

    tracker.joined()  # join() returned: everything scheduled so far is done
    for value in values[4:]:
        if value is not values[5]:
            value.finish()
    tracker.poll(11.2, final=True)
    step, last = emitter.lines[-1]
    assert (step, last["loss"], last["steps_per_s"]) == (9, 1 / 10, pytest.approx(5 / 0.2))


def test_a_loop_done_within_one_poll_still_reports_once_at_the_end() -> None:
    clock = iter([0.0, 2.0])
    emitter = Emitter()
    tracker = CoordinatorTracker(emitter, clock=lambda: next(clock))  # type: ignore[arg-type]
    values = [RemoteValue(Tensor(0.5)) for _ in range(4)]
    for value in values:
        tracker.scheduled(value)  # the first at 0.0
        value.finish()
    tracker.poll(2.0, final=True)

    assert emitter.lines == [(4, {"steps_per_s": 2.0, "step_time_s": 0.5, "loss": 0.5})]


def test_only_floating_scalars_or_dicts_of_them_are_read() -> None:
    def done(values: Any) -> RemoteValue:
        value = RemoteValue(values)
        value.finish()
        return value

    assert scalar_results(done(Tensor(0.25))) == {"loss": 0.25}
    assert scalar_results(done({"loss": Tensor(0.5), "accuracy": Tensor(0.75), "n": Tensor(3, floating=False)})) == {
        "loss": 0.5,
        "accuracy": 0.75,
    }
    for nothing in (None, Tensor([1.0, 2.0], shape=(2,)), Tensor(3, floating=False), (Tensor(1.0),)):
        value = done(nothing)
        assert scalar_results(value) == {}
        assert value.fetches == 0  # nothing worth copying was copied


def test_keras_scheduling_and_a_failing_tracker_are_left_alone(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    scheduled: list[Any] = []

    class ClusterCoordinator:
        strategy = None

        def schedule(self, fn: Any, args: Any = None, kwargs: Any = None) -> str:
            return f"result of {fn.__name__}"

        def join(self) -> None:
            pass

    module = types.ModuleType("fake_cluster_coordinator")
    module.ClusterCoordinator = ClusterCoordinator  # type: ignore[attr-defined]
    assert coordinator.patch_coordinator(module) and coordinator.patch_coordinator(module)  # once

    class Tracker:
        def scheduled(self, value: Any) -> None:
            scheduled.append(value)

    monkeypatch.setattr(coordinator, "tracker", lambda _c: Tracker())

    def user_step() -> None:
        pass

    def train_function() -> None:
        pass

    train_function.__module__ = "tf_keras.src.engine.training"
    c = ClusterCoordinator()
    assert c.schedule(user_step) == "result of user_step"
    assert c.schedule(train_function) == "result of train_function"
    with coordinator.inside_keras():
        c.schedule(user_step)
    assert scheduled == ["result of user_step"]

    def broken(_c: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(coordinator, "tracker", broken)
    monkeypatch.setattr(coordinator, "_failed", False)
    assert c.schedule(user_step) == "result of user_step"  # the user's call still returns its value
    assert coordinator._failed
