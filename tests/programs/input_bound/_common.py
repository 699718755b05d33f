"""What the three input-bound scripts share: the data, the model and how long they run (kept out of the scripts so
each reads as the one change it makes). Plain tf_keras `model.fit` over a tf.data.Dataset, nothing of tfdash.

INPUT_BOUND_BATCHES (default 20) batches per epoch, INPUT_BOUND_EPOCHS (default 2) epochs, INPUT_BOUND_SEED
(default 0) the data's and the weights' seed; the bench and the test set them. INPUT_BOUND_MIN_EPOCH_S (default 0)
raises the batches so that an epoch's compute alone lasts that long: the test needs a few 0.5 s metric windows, and a
fixed count of batches gave only two on a machine whose steps took under 50 ms instead of 100-300 ms (CI: "2
train windows"). The scripts therefore build the model (which times a step) before the data. That count divides by
the fastest of the timed steps, not their median: load on the other cores while the steps are timed that is gone by
the time fit runs would make the epoch shorter than asked.

The map waits SLOWDOWN (1) times the model's training step per batch, like a slow decoder or a remote read:
`model()` times a few compiled steps first and sets it, so the scripts mean the same on a fast machine and a loaded
one (a fixed sleep against steps of 15-50 ms judged the parallel map highly input-bound whenever the machine was
quiet). The plain map runs inline (sleepy_map.py turns off the prefetch tf.data would otherwise add by itself): a
step waits for its whole batch, half its time. A sleeping py_function holds one of tf.data's threads, as many as the
machine has cores (measured: 32 sleeps of 50 ms took 1.68 s one at a time, 0.84 s with num_parallel_calls=16 on 2
cores), so on 2 cores the parallel map makes a batch in half a step and, prefetched, keeps up; with more cores,
easily. Both keep their verdict while the step time drifts 2-fold from the one timed (this machine is shared). The
model is heavy (two 2048-wide layers, 100-300 ms a step here) so that each py_function call's own cost (it needs the
GIL, which fit's Python loop holds between steps) stays small. PARALLEL_CALLS (16) rather than AUTOTUNE: what
AUTOTUNE picks depends on the machine's cores, and a fixed number makes the run the same wherever it runs.
"""

from __future__ import annotations

import math
import os
import time
from typing import NamedTuple

import numpy as np
import tensorflow as tf


class StepTime(NamedTuple):
    median_s: float  # what the map sleeps a batch: a typical step
    fastest_s: float  # what the epoch's length divides by: the machine at its quietest while the steps were timed


BATCH = 64
FEATURES = 256
SLOWDOWN = 1.0
PARALLEL_CALLS = 16
BATCHES = int(os.environ.get("INPUT_BOUND_BATCHES", "20"))
EPOCHS = int(os.environ.get("INPUT_BOUND_EPOCHS", "2"))
SEED = int(os.environ.get("INPUT_BOUND_SEED", "0"))
MIN_EPOCH_S = float(os.environ.get("INPUT_BOUND_MIN_EPOCH_S", "0"))
MAX_BATCHES = 2000  # 125 MiB of examples (64 x 256 float32 each): a bound on what a very fast machine builds
tf.random.set_seed(SEED)
_step: list[StepTime] = []  # set by model(): one training step's compute, measured


def batches() -> int:
    """Batches per epoch: BATCHES, or more where MIN_EPOCH_S asks for a longer epoch than that at the measured step."""
    if not MIN_EPOCH_S:
        return BATCHES
    if not _step:
        raise RuntimeError("model() times a step; call it before examples()")
    return min(MAX_BATCHES, max(BATCHES, math.ceil(MIN_EPOCH_S / _step[0].fastest_s)))


def examples() -> tf.data.Dataset:
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(batches() * BATCH, FEATURES)).astype("float32")
    y = (x[:, :8].sum(axis=1) > 0).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y))


def slow_decode(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """A map step that waits SLOWDOWN steps per batch outside TensorFlow's own kernels, as Python decoders do."""

    def decode(batch: tf.Tensor) -> tf.Tensor:
        time.sleep(SLOWDOWN * _step[0].median_s)
        return batch

    decoded = tf.py_function(decode, [x], tf.float32)
    decoded.set_shape(x.shape)
    return decoded, y


def model() -> tf.keras.Model:
    keras = tf.keras
    net = keras.Sequential(
        [
            keras.Input(shape=(FEATURES,)),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(2),
        ]
    )
    net.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _step[:] = [_compute_seconds(net)]
    print(
        f"the map sleeps {SLOWDOWN * _step[0].median_s * 1000:.1f} ms a batch; {batches()} batches an epoch", flush=True
    )
    return net


def _compute_seconds(net: tf.keras.Model) -> StepTime:
    """One training step's compute (forward, backward, the optimizer's update), compiled, 9 times. Not
    train_on_batch: it builds a dataset per call, and took 5-10 times fit's step here; not the gradients alone: Adam's
    update is a good part of the step."""
    x, y = tf.zeros((BATCH, FEATURES)), tf.zeros((BATCH,), tf.int64)

    @tf.function
    def step() -> None:
        with tf.GradientTape() as tape:
            loss = net.compiled_loss(y, net(x, training=True))
        grads = tape.gradient(loss, net.trainable_variables)
        net.optimizer.apply_gradients(zip(grads, net.trainable_variables, strict=True))

    step()  # traced
    times = []
    for _ in range(9):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return StepTime(float(np.median(times)), min(times))
