"""MultiWorkerMirroredStrategy training with tf.keras ``model.fit``; the cluster comes from TF_CONFIG.

Every worker saves its final weights to ``--out/weights-<task_type>-<task_index>.npz`` (identical across workers
when the all-reduce worked) and prints ``final loss <value>``.

Needs legacy Keras (``TF_USE_LEGACY_KERAS=1``): Keras 3 ``model.fit`` does not support this strategy.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import tensorflow as tf

EXAMPLES = 2048
FEATURES = 20
CLASSES = 2


def make_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A learnable, seeded classification problem: the label is the side of a fixed hyperplane.

    Every worker generates the same arrays; auto-sharding then gives each worker its own part of every batch.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    w = rng.normal(size=(FEATURES,)).astype("float32")
    y = (x @ w > 0).astype("int64")
    return x, y


class SleepPerEpoch(tf.keras.callbacks.Callback):
    """Sleeps at the end of every epoch, to keep a job running for a while."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        time.sleep(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--epochs-sleep", type=float, default=0.0, help="seconds to sleep after every epoch")
    parser.add_argument("--out", default=None, help="directory for this worker's final weights")
    args = parser.parse_args()

    # Create the strategy first: it reads TF_CONFIG and starts this task's collective server.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    task_type = resolver.task_type or "worker"
    task_id = resolver.task_id or 0
    print(f"{task_type} {task_id}: replicas in sync {strategy.num_replicas_in_sync}", flush=True)

    tf.keras.utils.set_random_seed(args.seed)
    x, y = make_data(args.seed)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(EXAMPLES, seed=args.seed)
        .batch(args.batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )
    # In-memory data has no files to shard by: shard by element instead.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(options)

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(FEATURES,)),
                tf.keras.layers.Dense(32, activation="relu"),
                tf.keras.layers.Dense(CLASSES),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )

    callbacks = [SleepPerEpoch(args.epochs_sleep)] if args.epochs_sleep > 0 else []
    history = model.fit(dataset, epochs=args.epochs, callbacks=callbacks, verbose=2)

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"weights-{task_type}-{task_id}.npz")
        np.savez(path, *model.get_weights())
        print(f"saved weights to {path}", flush=True)
    print(f"final loss {history.history['loss'][-1]:.6f}", flush=True)


if __name__ == "__main__":
    main()
