"""Metrics for an unmodified ParameterServer custom loop: `ClusterCoordinator.schedule` / `join` get counted.

The injected hook (worker_agent/hooks/sitecustomize.py) calls `patch_coordinator(module)` once TensorFlow has loaded
`tensorflow.python.distribute.coordinator.cluster_coordinator` (what `tf.distribute.coordinator.ClusterCoordinator`
and its `experimental` alias name), the way it patches Keras' `Model.fit`. The user's code is not changed.

What is captured, in the coordinator (chief) process only, as phase "train" metric lines:
- `step`: the number of scheduled functions that completed successfully so far in this process (one
  `coordinator.schedule(fn, ...)` call that finished = one step; a closure that failed or was cancelled is not
  counted). Every scheduled function counts, a training step or not.
- `steps_per_s`: steps completed in the window / the window's seconds; `step_time_s` is its inverse (with several
  workers steps overlap, so this is the coordinator's pace, not one step's latency). Windows are at least
  MIN_INTERVAL_S (0.5 s) long; the first opens when the first steps are seen done, so tracing and start-up are not
  counted. Completions are seen by polling every POLL_S (0.1 s), so times are accurate to about that.
- `loss`: when the newest completed scheduled function of the window returned a floating-point scalar tensor (e.g.
  `strategy.reduce(SUM, per_replica_losses, axis=None)`), its value; when it returned a dict of such scalars, each
  one under its own name (`{"loss": ..., "accuracy": ...}`). Anything else (no return value, per-replica values,
  vectors, integers) adds no value metric. One value per window is copied to the coordinator, never more.
- a "facts" line once: source "injected", loop "ClusterCoordinator", the strategy's class name, replicas in sync.
Not captured: examples/s (the batch size is inside the user's dataset function), epochs, validation.

`patch_coordinator` also has worker_agent/runtime/worker_pace.py count each worker's completed closures (for `fit`
under ParameterServer as well) and, in a worker process, report its own CPU share: what the slow-worker insight reads.

Cost and synchronisation: on the training thread `schedule` adds one lock-held append and `join` one event set; the
rest runs on a daemon thread. A result is only read from a closure that is already done (its value is on a worker:
reading it is one small copy, on the reporting thread), so the user's loop never waits for anything it did not wait
for already. At interpreter exit the last window is reported (waiting at most STOP_WAIT_S). Functions that Keras
schedules itself (`Model.fit` / `evaluate` under ParameterServerStrategy) are left out: `fit` reports through its
own callback. Any failure in here disables the counting (one line on stderr); the user's program runs on.

Done-ness and results are read from TF's RemoteValueImpl (`_status_available_event`, `_status`, `_error`,
`_values`; TF 2.21): on a TensorFlow without them, steps are counted when `join()` returns and no loss is read.
"""

from __future__ import annotations

import atexit
import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from worker_agent.runtime.emitter import Emitter, get_emitter
from worker_agent.runtime.metrics import MIN_INTERVAL_S, last_step
from worker_agent.runtime.worker_pace import patch_workers, start_process_load

POLL_S = 0.1
STOP_WAIT_S = 3.0
KERAS_MODULES = ("keras", "tf_keras")

_tracker: CoordinatorTracker | None = None
_tracker_lock = threading.Lock()
_keras_depth = threading.local()


def patch_coordinator(module: ModuleType) -> bool:
    """Wrap `module.ClusterCoordinator.schedule` and `join` (once); True when they are wrapped now or already were."""
    try:  # per-worker pace (fit and custom loops alike) and each worker's CPU share: worker_pace.py
        patch_workers(module)
        start_process_load()
    except Exception as exc:
        _warn(f"per-worker pace is off: {exc!r}")
    cls = getattr(module, "ClusterCoordinator", None)
    if cls is None or not callable(getattr(cls, "schedule", None)) or not callable(getattr(cls, "join", None)):
        _warn(f"{module.__name__} has no ClusterCoordinator.schedule/join: custom loops report nothing")
        return False
    if getattr(cls.schedule, "_tfdash_patched", False):
        return True
    cls.schedule = _wrap_schedule(cls.schedule)
    cls.join = _wrap_join(cls.join)
    return True


@contextmanager
def inside_keras() -> Iterator[None]:
    """Marks the current thread as running Keras' own loop (the patched `fit`): what it schedules is not counted."""
    _keras_depth.value = getattr(_keras_depth, "value", 0) + 1
    try:
        yield
    finally:
        _keras_depth.value -= 1


def _from_keras(fn: Any) -> bool:
    if getattr(_keras_depth, "value", 0):
        return True
    module = getattr(getattr(fn, "python_function", fn), "__module__", None) or ""
    return module.split(".", 1)[0] in KERAS_MODULES


def _wrap_schedule(schedule: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(schedule)
    def patched_schedule(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        remote_value = schedule(self, fn, *args, **kwargs)
        try:
            if not _failed and not _from_keras(fn):
                tracker(self).scheduled(remote_value)
        except Exception as exc:  # never stand between the user and their training
            _disable(exc)
        return remote_value

    patched_schedule._tfdash_patched = True  # type: ignore[attr-defined]
    return patched_schedule


def _wrap_join(join: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(join)
    def patched_join(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = join(self, *args, **kwargs)
        tracking = _tracker
        if tracking is not None:
            tracking.joined()
        return result

    patched_join._tfdash_patched = True  # type: ignore[attr-defined]
    return patched_join


def tracker(coordinator: Any) -> CoordinatorTracker:
    """The process's tracker, started by the first counted `schedule` (one per process: the coordinator is one)."""
    global _tracker
    if _tracker is None:
        with _tracker_lock:
            if _tracker is None:
                strategy = getattr(coordinator, "strategy", None)
                facts = {
                    "source": "injected",
                    "loop": "ClusterCoordinator",
                    "strategy": type(strategy).__name__ if strategy is not None else "",
                    "replicas_in_sync": int(getattr(strategy, "num_replicas_in_sync", 1) or 1),
                }
                started = CoordinatorTracker(get_emitter(), facts=facts, step_offset=last_step())
                started.start()
                atexit.register(started.stop)
                _tracker = started
    return _tracker


class CoordinatorTracker:
    """Counts completed scheduled functions and reports them every MIN_INTERVAL_S from its own thread."""

    def __init__(
        self,
        emitter: Emitter,
        *,
        facts: dict[str, Any] | None = None,
        step_offset: int = 0,
        min_interval_s: float = MIN_INTERVAL_S,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.emitter = emitter
        self.facts = facts
        self.step_offset = step_offset
        self.min_interval_s = min_interval_s
        self.poll_s = poll_s
        self._clock = clock
        self._lock = threading.Lock()  # guards _pending and the counters the training thread writes
        self._pending: list[tuple[int, Any]] = []  # (number in schedule order, remote value), not seen done yet
        self._scheduled = 0
        self._first_scheduled_at = 0.0
        self._joined_upto = 0  # every function scheduled up to this number is done (a join() returned after it)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # Reporting thread only:
        self.done = 0
        self._window_t0: float | None = None
        self._window_base = 0
        self._newest: tuple[int, Any] | None = None  # the newest done (number, remote value) of the open window
        self.reports = 0
        self.failed = False

    # --- the training thread ------------------------------------------------------------------------------------
    def scheduled(self, remote_value: Any) -> None:
        with self._lock:
            if not self._scheduled:
                self._first_scheduled_at = self._clock()
            self._scheduled += 1
            self._pending.append((self._scheduled, remote_value))

    def joined(self) -> None:
        with self._lock:
            self._joined_upto = self._scheduled
        self._wake.set()

    # --- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tfdash-coordinator-metrics", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = STOP_WAIT_S) -> None:
        """Report the last window and end the thread (at exit: the loop has nothing more to schedule)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the reporting thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self.facts is not None:
                self.emitter.facts(self.facts)
            while not self._stopping.is_set():
                self._wake.wait(self.poll_s)
                self._wake.clear()
                self.poll(self._clock())
            self.poll(self._clock(), final=True)
        except Exception as exc:
            self.failed = True
            _warn(f"ClusterCoordinator metrics stopped after an error: {exc!r}")

    def poll(self, now: float, *, final: bool = False) -> None:
        """Take the functions seen done since the last poll; report a window once it is min_interval_s long (or, when
        `final`, whatever it holds)."""
        with self._lock:
            joined_upto = self._joined_upto
            finished = [(n, rv) for n, rv in self._pending if n <= joined_upto or _is_done(rv)]
            if finished:
                gone = {n for n, _rv in finished}
                self._pending = [(n, rv) for n, rv in self._pending if n not in gone]
        succeeded = [(n, rv) for n, rv in finished if _succeeded(rv)]
        if succeeded:
            self.done += len(succeeded)
            newest = max(succeeded, key=lambda item: item[0])
            if self._newest is None or newest[0] > self._newest[0]:
                self._newest = newest
            if self._window_t0 is None:  # the first steps seen done open the first window (start-up not counted)
                self._window_t0, self._window_base = now, self.done
                if not final:
                    return
        if final and not self.reports and self.done:
            # Everything finished within one poll (a very short loop): one line over the whole run, from the first
            # schedule, rather than none.
            self._window_t0, self._window_base = self._first_scheduled_at, 0
        if self._window_t0 is None or self.done <= self._window_base:
            return
        if now - self._window_t0 >= self.min_interval_s or (final and now > self._window_t0):
            self._report(now)

    def _report(self, now: float) -> None:
        assert self._window_t0 is not None
        steps = self.done - self._window_base
        elapsed = now - self._window_t0
        self._window_t0, self._window_base = now, self.done
        values: dict[str, Any] = {"steps_per_s": steps / elapsed, "step_time_s": elapsed / steps}
        if self._newest is not None:
            values.update(scalar_results(self._newest[1]))
        self.emitter.metric(self.step_offset + self.done, values, phase="train")
        self.reports += 1


def _is_done(remote_value: Any) -> bool:
    """Whether the closure behind `remote_value` has finished, without waiting (TF's RemoteValueImpl sets this event
    when its values, error or cancellation are in; a value without one is only known done at join())."""
    event = getattr(remote_value, "_status_available_event", None)
    return bool(event is not None and event.is_set())


def _succeeded(remote_value: Any) -> bool:
    status = getattr(getattr(remote_value, "_status", None), "name", "READY")
    return status != "ABORTED" and getattr(remote_value, "_error", None) is None


def scalar_results(remote_value: Any) -> dict[str, float]:
    """A done function's floating-point scalar result as {"loss": value}, or a dict of them by name; else {}."""
    values = getattr(remote_value, "_values", None)
    if values is None or not callable(getattr(remote_value, "fetch", None)):
        return {}
    if _is_float_scalar(values):
        names: list[str] | None = None
    elif isinstance(values, dict) and values and all(isinstance(k, str) for k in values):
        names = [k for k, v in values.items() if _is_float_scalar(v)]
        if not names:
            return {}
    else:
        return {}
    fetched = remote_value.fetch()  # done: no waiting for training, one small copy from the worker
    if names is None:
        return {"loss": float(fetched)}
    return {name: float(fetched[name]) for name in names}


def _is_float_scalar(value: Any) -> bool:
    shape = getattr(value, "shape", None)
    rank = getattr(shape, "rank", None) if shape is not None and not isinstance(shape, tuple) else None
    if isinstance(shape, tuple):
        rank = len(shape)
    return rank == 0 and bool(getattr(getattr(value, "dtype", None), "is_floating", False))


_failed = False


def _disable(exc: BaseException) -> None:
    global _failed
    if not _failed:
        _failed = True
        _warn(f"ClusterCoordinator metrics are off after an error: {exc!r}")


def _warn(message: str) -> None:
    print(f"tfdash: {message}", file=sys.stderr, flush=True)
