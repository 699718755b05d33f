"""A user's MultiWorkerMirrored `model.fit` script with its own `BackupAndRestore` under the job's folder, as
TensorFlow's multi-worker guide writes it: no tfdash import, no preemption code. `--steps` steps an epoch.

Needs legacy Keras (``TF_USE_LEGACY_KERAS=1``): Keras 3 ``model.fit`` does not support this strategy.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2048, 20)).astype("float32")
    y = (x @ rng.normal(size=(20,)).astype("float32") > 0).astype("int64")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(options)

    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input(shape=(20,)), tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(2)]
        )
        model.compile(
            optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    backup = tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(os.environ["TFDASH_JOB_DIR"], "backup"))
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps, callbacks=[backup], verbose=2)
    print("trained", flush=True)


if __name__ == "__main__":
    main()
