"""Keras 3's `model.fit` under MultiWorkerMirroredStrategy (an explicit `import keras`, so legacy Keras cannot help):
it fails with `ValueError: Attempt to convert a value (PerReplica:{...}) with an unsupported type` (keras-team/keras
#20585; ../shared/TF_NOTES.md). Run as two workers, the cluster from TF_CONFIG."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

if __name__ == "__main__":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 8), dtype="float32"), rng.random((64, 1), dtype="float32")
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1, verbose=2)
