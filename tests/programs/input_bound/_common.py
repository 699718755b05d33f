"""What the three input-bound scripts share: the data, the model and how long they run (kept out of the scripts so
each reads as the one change it makes). Plain tf_keras `model.fit` over a tf.data.Dataset, nothing of tfdash.

INPUT_BOUND_BATCHES (default 40) batches per epoch, INPUT_BOUND_EPOCHS (default 2) epochs, INPUT_BOUND_SEED
(default 0) the data's and the weights' seed; the bench and the test set them.

SLEEP_S (0.1 s) is what the map waits per batch, like a slow decoder or a remote read; the model's step took 30-50 ms
on a loaded 2-core machine. tf.data puts a prefetch after the last step by itself (inject_prefetch), so even the
plain map runs beside the training step, one batch at a time: it waits about SLEEP_S minus the step per step
(measured ~50 % of the step time). With parallel calls the map keeps up and only an epoch's first batch is waited for.
"""

from __future__ import annotations

import os
import time

import numpy as np
import tensorflow as tf

BATCH = 64
FEATURES = 256
SLEEP_S = 0.1
BATCHES = int(os.environ.get("INPUT_BOUND_BATCHES", "40"))
EPOCHS = int(os.environ.get("INPUT_BOUND_EPOCHS", "2"))
SEED = int(os.environ.get("INPUT_BOUND_SEED", "0"))
tf.random.set_seed(SEED)


def examples() -> tf.data.Dataset:
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(BATCHES * BATCH, FEATURES)).astype("float32")
    y = (x[:, :8].sum(axis=1) > 0).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y))


def slow_decode(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """A map step that waits SLEEP_S per batch outside TensorFlow's own kernels, as Python decoders do."""

    def decode(batch: tf.Tensor) -> tf.Tensor:
        time.sleep(SLEEP_S)
        return batch

    decoded = tf.py_function(decode, [x], tf.float32)
    decoded.set_shape(x.shape)
    return decoded, y


def model() -> tf.keras.Model:
    keras = tf.keras
    net = keras.Sequential(
        [
            keras.Input(shape=(FEATURES,)),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(2),
        ]
    )
    net.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return net
