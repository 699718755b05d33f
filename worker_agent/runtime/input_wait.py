"""How long `Model.fit` waits for its input pipeline: sampled steps whose batch is fetched by a timed function.

Inside a compiled train step, `next(iterator)` is an op of the graph (IteratorGetNext): nothing in Python sees how
long it took, and TensorFlow keeps its own tf.data counters (/tensorflow/data/iterator_busy, getnext_duration) out of
Python's reach. So `patch_make_train_function` wraps the train function Keras builds in a `SampledTrainFunction`:
most steps call Keras' own function unchanged; a sampled step times its IteratorGetNext inside the graph
(`tf.timestamp()` before and after it, ordered by control dependencies) and runs the same step on that batch:
- tf_keras: one compiled function fetches (timed) and calls tf_keras' own train function body
  (`train_tf_function.python_function`) with a one-batch stand-in iterator, so the step is tf_keras' code
  (strategy.run, reduction, step counter, jit_compile) exactly; only the two timestamps are added. A sampled step
  cost 0.02-0.05 ms more than tf_keras' own on 0.6-0.7 ms steps (bench/overhead.py's last line, 2026-11-28; a fetch
  function and a step function called one after the other cost ~1 ms more).
- Keras 3: a compiled timed fetch, then Keras 3's own train function on a one-batch list (it accepts an iterable and
  runs its compiled `one_step_on_data` on each element); measured no slower than its own step.
An eager `next()` would have been simpler, but it costs 0.22-0.33 ms of Python and op dispatch per fetch of data
that is ready (measured here), which a compiled step never pays: a pipeline with nothing to wait for read as 20 %
input-bound on 1.4 ms steps. At the end of the data the fetch raises OutOfRangeError, as Keras' own step does.

Which steps are sampled: each at random with probability (mean step time / SAMPLE_GAP_S), so about one step per
SAMPLE_GAP_S (50 ms) of training is, and every step of 50 ms or more: the extra cost stays about 0.05 ms per 50 ms
(~0.1 %) whatever the step time. (Drawn as the number of steps to the next sample, not as a coin at each step: the
same law, and the steps between cost nothing.) Random, not
"the first step 50 ms after the last sample": that rule samples every step that follows a pause (validation, an
epoch's end), and an epoch's first fetch waits for a new iterator to fill its buffers, so it over-counted epoch
starts. MultiWorkerMirrored is sampled by step count instead (every SYNC_EVERY-th step, the same steps on every
worker): fetching from a distributed iterator may run a collective (whether any worker still has data) that every
worker must run at the same step. The first sampled step traces the timed function and is not counted.

Left alone (no samples, so no input_wait_fraction): ParameterServer (fit schedules closures on remote workers: the
wait is theirs), steps_per_execution > 1, run_eagerly, a model whose class overrides make_train_function without
calling ours, and custom training loops (what they fetch is the user's own code).
"""

from __future__ import annotations

import functools
import math
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

SAMPLE_GAP_S = 0.05
SYNC_EVERY = 16


class InputWaitRecorder:
    """Sums over sampled steps: the seconds spent fetching, and how many steps. Read by the metrics callback."""

    def __init__(self) -> None:
        self.wait_s = 0.0
        self.steps = 0
        self.active = 0  # fits in progress with a callback reading us; sampling costs nothing while 0
        self._lock = threading.Lock()

    def add(self, wait_s: float) -> None:
        self.wait_s += wait_s  # the training thread is the only writer; readers take a consistent enough pair
        self.steps += 1

    def snapshot(self) -> tuple[float, int]:
        return self.wait_s, self.steps

    def start(self) -> None:
        with self._lock:
            self.active += 1

    def stop(self) -> None:
        with self._lock:
            self.active = max(0, self.active - 1)


recorder = InputWaitRecorder()


class _OneBatch:
    """A stand-in iterator for tf_keras' step body: at trace time `next()` gives the compiled function's argument."""

    def __init__(self, data: Any) -> None:
        self._data = data

    def __iter__(self) -> _OneBatch:
        return self

    def __next__(self) -> Any:
        return self._data

    def get_next(self) -> Any:
        return self._data


class SampledTrainFunction:
    """Keras' train function, with now and then a sampled step whose fetch is timed (see the module).

    Per step it only counts down to the next sample, chosen as a sample begins (`_steps_to_next`), and times the one
    step just before a sample for the rate: a call costs 0.10 us of Python, where a coin thrown and two clock reads at
    every step cost 0.68 us (measured 2026-11-28 with a trivial train function, a million calls)."""

    _tfdash_sampled = True

    def __init__(
        self,
        original: Callable[[Any], Any],
        timed: Callable[[Any], Any],
        every_steps: int = 0,
        gap_s: float = SAMPLE_GAP_S,
        clock: Callable[[], float] = time.perf_counter,
        rec: InputWaitRecorder | None = None,
        random_source: Callable[[], float] | None = None,
    ) -> None:
        self.original = original
        self.timed = timed  # iterator -> (Keras' step outputs, seconds its fetch took)
        self._gap_s = gap_s
        self._every = every_steps  # > 0: sample by step count (synchronous workers), else by time
        self._clock = clock
        self._rec = rec if rec is not None else recorder
        self._random = random.Random(0).random if random_source is None else random_source  # noqa: S311 - sampling
        self._left = 1  # calls until the next sample, this one included: the first call is one (it traces)
        self._step_s: float | None = None
        self._traced = False
        self._original_traced = False

    def __call__(self, iterator: Any) -> Any:
        left = self._left - 1
        self._left = left
        if left > 1:  # most steps: Keras' own, untouched
            return self.original(iterator)
        if left == 1:  # the step before a sample: its time sets the sampling rate
            return self._timed_original(iterator)
        # The next sample is chosen before this one runs, so the count stays the same on every worker even when this
        # step raises (the end of the data).
        self._left = self._steps_to_next()
        if not self._rec.active:  # no callback reads the samples: this one is skipped, the count goes on
            return self.original(iterator)
        start = self._clock()
        outputs, waited = self.timed(iterator)  # OutOfRangeError at the end of the data, as Keras' own step raises
        if self._traced:  # the first sample traced both functions: its time is not a step's
            self._rec.add(float(waited))
            if self._step_s is None:  # a sampled step is a little slower: it stands in until a plain one is timed
                self._step_s = self._clock() - start
        self._traced = True
        return outputs

    def _timed_original(self, iterator: Any) -> Any:
        start = self._clock()
        outputs = self.original(iterator)
        if self._original_traced:  # its first timed call may have traced it: not a step's time
            self._note_duration(self._clock() - start)
        self._original_traced = True
        return outputs

    def _steps_to_next(self) -> int:
        """How many calls from now the next sample is, decided from earlier steps only, so a step's own wait never
        makes it likelier to be sampled (sampling "the first step after a pause" would over-count epoch starts).
        Synchronous workers: every `every`-th call, counted from the first, the same calls on every worker. Else a
        geometric draw with success (mean step time / gap): the same law as a coin thrown at each step, so about one
        step per gap of training is sampled, and every step as long as the gap."""
        if self._every > 0:
            return self._every
        if self._step_s is None:
            return 1
        chance = self._step_s / self._gap_s
        if chance >= 1.0:
            return 1
        if chance <= 0.0:  # a step the clock saw take no time (too coarse a clock): time the next one again
            return 2
        draw = 1.0 - self._random()  # in (0, 1]
        return 1 + int(math.log(draw) / math.log1p(-chance))

    def _note_duration(self, seconds: float) -> None:
        # A moving mean of the train function's own calls (not of the time between them: validation and callbacks
        # between steps are not steps).
        self._step_s = seconds if self._step_s is None else 0.9 * self._step_s + 0.1 * seconds

    def __getattr__(self, name: str) -> Any:  # anything else Keras or a user reads of the function
        return getattr(self.original, name)


def sampled(model: Any, function: Any, flavour: str) -> Any:
    """`function` wrapped for sampling, or `function` itself when this model's steps cannot be sampled."""
    if function is None or getattr(function, "_tfdash_sampled", False):
        return function
    if getattr(model, "_cluster_coordinator", None) is not None or getattr(model, "run_eagerly", False):
        return function
    import tensorflow as tf  # loaded already: Keras imported it

    every = SYNC_EVERY if _synchronous_workers(model) else 0
    if flavour == "keras3":
        if int(getattr(model, "steps_per_execution", 1) or 1) != 1:
            return function
        fetch = tf.function(_timed_next, autograph=False)

        def fetch_then_step(iterator: Any) -> Any:
            data, waited = fetch(iterator)
            return function([data]), waited  # Keras 3's train function takes a list of batches too

        return SampledTrainFunction(function, fetch_then_step, every)
    body = getattr(getattr(model, "train_tf_function", None), "python_function", None)
    if body is None or not _one_step_per_call(model):
        return function

    def timed_step(iterator: Any) -> Any:
        data, waited = _timed_next(iterator)
        return body(_OneBatch(data)), waited

    return SampledTrainFunction(function, tf.function(timed_step, reduce_retracing=True), every)


def _timed_next(iterator: Any) -> Any:
    """The next batch and the seconds IteratorGetNext took, timed inside the graph. The batch handed on passes through
    identities that wait for the second timestamp: without them the executor may run the step's first ops before it
    (only "after the batch" is ordered), and the wait read 20-30 points high on two busy cores (measured)."""
    import tensorflow as tf

    start = tf.timestamp()
    with tf.control_dependencies([start]):
        data = next(iterator)
    with tf.control_dependencies(tf.nest.flatten(data, expand_composites=True)):
        end = tf.timestamp()
    with tf.control_dependencies([end]):
        data = tf.nest.map_structure(tf.identity, data, expand_composites=True)
    return data, end - start


def _one_step_per_call(model: Any) -> bool:
    if getattr(model, "autotune_steps_per_execution", False):
        return False
    steps = getattr(model, "_steps_per_execution", None)
    if steps is None:
        return True
    try:
        return int(steps.numpy().item()) == 1
    except Exception:
        return False


def _synchronous_workers(model: Any) -> bool:
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None or "CollectiveAllReduce" not in type(strategy).__name__:
        return False
    try:
        return bool(strategy.extended._in_multi_worker_mode())
    except Exception:
        return True  # cannot tell: the step count is safe either way


def patch_make_train_function(model_class: Any, flavour: str) -> None:
    """Wrap `model_class.make_train_function` (once) so the function it leaves on the model samples input waits."""
    make = getattr(model_class, "make_train_function", None)
    if make is None or getattr(make, "_tfdash_patched", False):
        return

    @functools.wraps(make)
    def make_train_function(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = make(self, *args, **kwargs)
        try:
            wrapped = sampled(self, self.train_function, flavour)
            if wrapped is not self.train_function:
                self.train_function = wrapped
                if result is not None:
                    result = wrapped
        except Exception as exc:  # never stand between the user and their training
            print(f"tfdash: input-wait sampling is off: {exc!r}", file=sys.stderr, flush=True)
        return result

    make_train_function._tfdash_patched = True  # type: ignore[attr-defined]
    model_class.make_train_function = make_train_function


def wait_fraction(before: tuple[float, int], after: tuple[float, int], step_time_s: float) -> float | None:
    """The share of a window's mean step time spent waiting for input, from two recorder snapshots; None without
    samples in between."""
    steps = after[1] - before[1]
    if steps <= 0 or step_time_s <= 0:
        return None
    mean_wait = (after[0] - before[0]) / steps
    return min(1.0, max(0.0, mean_wait / step_time_s))


__all__ = [
    "SAMPLE_GAP_S",
    "SYNC_EVERY",
    "InputWaitRecorder",
    "SampledTrainFunction",
    "patch_make_train_function",
    "recorder",
    "sampled",
    "wait_fraction",
]
