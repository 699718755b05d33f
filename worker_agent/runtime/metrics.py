"""The Keras callback that turns training into "metric" (and "facts") lines, for tf_keras, Keras 2 and 3 alike.

The class is built per Keras flavour (`metrics_callback_class(keras_module.callbacks.Callback)`), so this module
imports neither. What it writes:
- phase "train", at most every `min_interval_s` (0.5 s): step (global step count), epoch, the running logs (loss,
  accuracy, ...), step_time_s, steps_per_s and examples_per_s averaged over the window, learning_rate read from the
  optimizer. A window closes at the first step end 0.5 s after it opened, or at an epoch's end when the last train
  line is 0.5 s old (so epochs shorter than a window still show their throughput, at the same rate limit).
- phase "epoch_end", after every epoch: the epoch's logs (val_* included), learning_rate and epoch_time_s.
Epochs are counted from 1 in these lines (the Nth epoch of the run, the one in progress or just finished); facts'
`resumed_from_epoch` is the number of epochs already done before this process started (0: a fresh run), and
`resumed_from_step` the steps of the next epoch done too (a backup saved mid-epoch at a stop, preemption.py; 0 at an
epoch boundary): the facts line waits for the first step's start, where Keras tells which step that is.

examples_per_s: the examples this task accounts for per step (its share of a synchronous global batch; the whole
batch for a ParameterServer coordinator) x steps in the window / window seconds. The first window of a fit starts
after its first step, so graph tracing is not counted as training; each later epoch's first window starts at the
epoch's start (validation is not training either). Per batch the callback only takes time.perf_counter(), keeps
the logs' reference and compares; logs are converted and a line serialised only when a window closes.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from worker_agent.runtime.emitter import Emitter, as_float, finite_floats, get_emitter
from worker_agent.runtime.input_wait import recorder as input_waits
from worker_agent.runtime.input_wait import wait_fraction

MIN_INTERVAL_S = 0.5

# The highest global step written by any callback of this process, so a second `fit` in one user script continues the
# step axis instead of writing the same steps again (the orchestrator stores metrics idempotently by step).
_last_step = 0


def last_step() -> int:
    return _last_step


def _note_step(step: int) -> None:
    global _last_step
    _last_step = max(_last_step, step)


def _guarded(hook: Callable[..., None]) -> Callable[..., None]:
    """A failing hook disables the callback (one warning) instead of failing the user's training."""

    @functools.wraps(hook)
    def run(self: _MetricsLogic, *args: Any, **kwargs: Any) -> None:
        if self._tfdash_failed:
            return
        try:
            hook(self, *args, **kwargs)
        except Exception as exc:
            self._tfdash_failed = True
            print(f"tfdash: metrics callback disabled after an error in {hook.__name__}: {exc!r}", file=sys.stderr)

    return run


class _MetricsLogic:
    """Mixed in before a Keras `Callback` base; see `metrics_callback_class`."""

    _tfdash_metrics = True  # marks ours, so the injected hook does not add a second one
    _tfdash_legacy = False  # set per class: True for tf_keras and Keras 2

    def __init__(
        self,
        examples_per_step: int | None = None,
        facts: Mapping[str, Any] | None = None,
        emitter: Emitter | None = None,
        min_interval_s: float = MIN_INTERVAL_S,
        step_offset: int = 0,
        on_start: Callable[[int, int], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__()
        self._supports_tf_logs = True  # tf_keras: hand us logs as tensors, unconverted, so idle batches cost nothing
        self._tfdash_failed = False
        self.examples_per_step = examples_per_step
        self.facts = dict(facts) if facts is not None else None
        self.emitter = emitter if emitter is not None else get_emitter()
        self.min_interval_s = min_interval_s
        self.step_offset = step_offset
        self._on_start = on_start
        self._clock = clock
        self._started = False
        self._epoch = 0
        self._epoch_t0 = 0.0
        self._window_t0: float | None = None
        self._window_base = 0  # steps of this epoch done when the window opened
        self._steps_before_epoch = 0  # only used while the epoch length is unknown
        self._last_batch = -1
        self._last_batch_t = 0.0
        self._last_logs: Any = None
        self._last_emit_t = -math.inf
        self._batch_scale = 1.0
        self._first_epoch_of_fit = True
        self._waits_at_open = (0.0, 0)  # input_wait.recorder's sums when the window opened
        self._sampling = False
        self._resume_epoch: int | None = None  # the first epoch of this process, until its first step says the step
        self.last_begun = (-1, -1)  # (epoch, batch) of the last step begun, from 0: a stop's exit says it (train.py)

    # --- Keras hooks --------------------------------------------------------------------------------------------
    @_guarded
    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._window_t0 = None
        self._first_epoch_of_fit = True
        self._batch_scale = _batch_log_scale(getattr(self, "model", None), self._tfdash_legacy)
        if not self._sampling:  # input_wait.py samples fit's steps only while a callback reads the samples
            self._sampling = True
            input_waits.start()

    @_guarded
    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        if not self._started and self._resume_epoch is None:
            self._resume_epoch = epoch
        now = self._clock()
        self._epoch = epoch
        self._epoch_t0 = now
        self._last_batch = -1
        self._window_base = 0
        # The first epoch of a fit: open the window after the first step (tracing); later epochs: now.
        self._window_t0 = None if self._first_epoch_of_fit else now
        self._waits_at_open = input_waits.snapshot()
        self._first_epoch_of_fit = False

    # The two batch hooks run at every step: they only note the step and compare a clock, unguarded (nothing in them
    # can raise), and call the guarded part when there is something to do. Both, as Keras' CallbackList dispatches
    # them: 1.38 us a step with ours against 0.11 without (bench/overhead.py's "batch hooks" line, 2026-11-28).
    def on_train_batch_begin(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        # A numpy int64 after a mid-epoch restore (tf_keras counts from its backup's batch + 1): made int where used.
        self.last_begun = (self._epoch, batch)
        if not self._started:
            self._batch_begin_first(batch)

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        now = self._clock()
        self._last_batch, self._last_batch_t, self._last_logs = batch, now, logs
        if self._window_t0 is None or now - self._window_t0 >= self.min_interval_s:
            self._batch_end_window(now, batch, logs)

    @_guarded
    def _batch_begin_first(self, batch: int) -> None:
        # a fit resumed mid-epoch begins at the step after the saved one
        self._start(resumed_from_epoch=self._resume_epoch or 0, resumed_from_step=int(batch))

    @_guarded
    def _batch_end_window(self, now: float, batch: int, logs: Mapping[str, Any] | None) -> None:
        batch = int(batch)  # its steps go to JSON
        if self._window_t0 is None:
            self._window_t0 = now
            self._window_base = batch + 1
            self._waits_at_open = input_waits.snapshot()
        else:
            self._emit_window(now, batch, logs)

    @_guarded
    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        if not self._started:  # an epoch without steps (Keras ran none): it resumed at this epoch's start
            self._start(resumed_from_epoch=epoch if self._resume_epoch is None else self._resume_epoch)
        now = self._clock()
        last_batch = int(self._last_batch)
        if (
            self._window_t0 is not None
            and last_batch + 1 > self._window_base
            and self._last_batch_t - self._last_emit_t >= self.min_interval_s
        ):
            self._emit_window(self._last_batch_t, last_batch, self._last_logs)  # the epoch's unreported tail
        self._last_logs = None
        values: dict[str, Any] = dict(_resolved(logs))
        lr = self._learning_rate()
        if lr is not None:
            values["learning_rate"] = lr
        values["epoch_time_s"] = now - self._epoch_t0
        steps_per_epoch = self._steps_per_epoch()
        done = steps_per_epoch if steps_per_epoch is not None else last_batch + 1
        step = self._global_step(done - 1)
        if steps_per_epoch is None:
            self._steps_before_epoch += max(done, 0)
        self.emitter.metric(step, values, epoch=epoch + 1, phase="epoch_end")
        _note_step(step)

    @_guarded
    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        if self._sampling:
            self._sampling = False
            input_waits.stop()
        if not self._started:  # every epoch was done before this process started (resumed at the very end)
            params = getattr(self, "params", None) or {}
            self._start(resumed_from_epoch=int(params.get("epochs") or 0))

    # --- internals ----------------------------------------------------------------------------------------------
    def _start(self, resumed_from_epoch: int, resumed_from_step: int = 0) -> None:
        self._started = True
        if self.facts is not None:
            resumed = {"resumed_from_epoch": resumed_from_epoch, "resumed_from_step": resumed_from_step}
            self.emitter.facts({**self._run_length(), **self.facts, **resumed})
        if self._on_start is not None:
            self._on_start(resumed_from_epoch, resumed_from_step)

    def _run_length(self) -> dict[str, int]:
        """The fit's epochs and steps per epoch as Keras tells callbacks (`params`), for the job's progress and ETA
        (orchestrator/core/progress.py): a user's script says them nowhere else; the builtin runtime's facts do, and
        win. Steps are unknown (absent) for a dataset of unknown length without steps_per_epoch."""
        params = getattr(self, "params", None) or {}
        length: dict[str, int] = {}
        for fact, param in (("epochs", "epochs"), ("steps_per_epoch", "steps")):
            value = params.get(param)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                length[fact] = value
        return length

    def _emit_window(self, now: float, batch: int, logs: Mapping[str, Any] | None) -> None:
        steps = batch + 1 - self._window_base
        elapsed = now - self._window_t0 if self._window_t0 is not None else 0.0
        self._window_t0 = now
        self._window_base = batch + 1
        if steps <= 0 or elapsed <= 0:
            return
        self._last_emit_t = now
        values: dict[str, Any] = finite_floats(_resolved(logs))
        if self._batch_scale != 1.0:
            values = {name: value * self._batch_scale for name, value in values.items()}
        values["step_time_s"] = elapsed / steps
        values["steps_per_s"] = steps / elapsed
        waits = input_waits.snapshot()
        fraction = wait_fraction(self._waits_at_open, waits, elapsed / steps)
        self._waits_at_open = waits
        if fraction is not None:
            values["input_wait_fraction"] = fraction
        if self.examples_per_step:
            values["examples_per_s"] = self.examples_per_step * steps / elapsed
        lr = self._learning_rate()
        if lr is not None:
            values["learning_rate"] = lr
        step = self._global_step(batch)
        self.emitter.metric(step, values, epoch=self._epoch + 1, phase="train")
        _note_step(step)

    def _steps_per_epoch(self) -> int | None:
        params = getattr(self, "params", None) or {}
        steps = params.get("steps")
        return int(steps) if steps else None

    def _global_step(self, batch: int) -> int:
        """Steps done when step `batch` (0-based, in the current epoch) ended, counted over the whole run."""
        steps_per_epoch = self._steps_per_epoch()
        before = self._epoch * steps_per_epoch if steps_per_epoch is not None else self._steps_before_epoch
        return self.step_offset + before + batch + 1

    def _learning_rate(self) -> float | None:
        optimizer = getattr(getattr(self, "model", None), "optimizer", None)
        if optimizer is None:
            return None
        try:
            rate = optimizer.learning_rate
        except Exception:  # no rate set, a wrapped optimizer, ...
            return None
        if callable(rate) and not hasattr(rate, "numpy"):  # a LearningRateSchedule: evaluate at the current step
            try:
                rate = rate(optimizer.iterations)
            except Exception:
                return None
        return as_float(rate)


def _resolved(logs: Any) -> Mapping[str, Any]:
    """The logs as a mapping. Under ParameterServer, tf_keras hands a batch's logs over as one RemoteValue: fetching
    waits for that step to finish on its worker, which is why it happens only when a window closes."""
    if logs is None:
        return {}
    if not isinstance(logs, Mapping) and callable(getattr(logs, "fetch", None)):
        logs = logs.fetch()
    return logs if isinstance(logs, Mapping) else {}


def _batch_log_scale(model: Any, legacy: bool) -> float:
    """The factor that turns tf_keras's per-batch logs into means over the replicas.

    Under MultiWorkerMirrored, tf_keras reduces a step's per-replica logs with `distribute_reduction_method`, whose
    "auto" means "sum" there: with N replicas in sync each batch's loss and metrics arrive N times too large (measured:
    accuracy 1.9 with 2 workers). Epoch logs are read from the metrics themselves and are right; single-machine
    Mirrored logs are right too; Keras 3 averages.
    """
    strategy = getattr(model, "distribute_strategy", None)
    if not legacy or strategy is None or "CollectiveAllReduce" not in type(strategy).__name__:
        return 1.0
    try:
        multi_worker = bool(strategy.extended._in_multi_worker_mode())
    except Exception:
        multi_worker = False
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    summed = getattr(model, "distribute_reduction_method", "auto") in ("auto", "sum")
    if not multi_worker or replicas <= 1 or not summed:
        return 1.0
    return 1.0 / replicas


_classes: dict[type, type] = {}


def metrics_callback_class(base: type) -> type:
    """The metrics callback class for a Keras flavour: give it `tf_keras.callbacks.Callback` or Keras 3's."""
    cls = _classes.get(base)
    if cls is None:
        legacy = _is_legacy(base)
        cls = type("TfdashMetrics", (_MetricsLogic, base), {"__module__": __name__, "_tfdash_legacy": legacy})
        _classes[base] = cls
    return cls


def _is_legacy(base: type) -> bool:
    """tf_keras, or Keras 2 itself (TensorFlow 2.15's `keras`, whose code tf_keras continues): the Keras whose
    per-batch logs are summed over MultiWorkerMirrored replicas."""
    top = base.__module__.split(".")[0]
    return top == "tf_keras" or str(getattr(sys.modules.get(top), "__version__", "")).startswith("2.")


def is_ours(callback: Any) -> bool:
    return bool(getattr(callback, "_tfdash_metrics", False))


__all__ = ["MIN_INTERVAL_S", "finite_floats", "is_ours", "last_step", "metrics_callback_class"]
