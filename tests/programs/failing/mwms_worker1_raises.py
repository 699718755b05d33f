"""A two-worker MultiWorkerMirrored fit (tf.keras) whose worker 1 raises in its second epoch (a bad batch): worker 1
is the cause, worker 0's collective then fails (`UnavailableError` / a collective abort) as a consequence."""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf


class BadBatchOnWorker1(tf.keras.callbacks.Callback):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.index == 1 and self._epoch == 1 and batch == 3:
            raise ValueError(f"corrupt record in shard {self.index}, batch {batch}")

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch


if __name__ == "__main__":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1024, 20)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).with_options(options)
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input((20,)), tf.keras.layers.Dense(16, "relu"), tf.keras.layers.Dense(2)]
        )
        model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(dataset, epochs=3, callbacks=[BadBatchOnWorker1(index)], verbose=2)
    print("done", flush=True)
