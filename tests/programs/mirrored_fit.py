"""Single-process MirroredStrategy over every local GPU, or else every logical CPU device; trains with model.fit.

Prints ``replicas in sync <n>`` and, at the end, ``final loss <value>``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import tensorflow as tf

EXAMPLES = 2048
FEATURES = 20
CLASSES = 2


def make_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A learnable, seeded classification problem: the label is the side of a fixed hyperplane."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    w = rng.normal(size=(FEATURES,)).astype("float32")
    y = (x @ w > 0).astype("int64")
    return x, y


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--expect-replicas", type=int, default=None, help="exit 2 unless this many replicas")
    parser.add_argument("--verbose", type=int, default=2, help="model.fit's: 1 draws a progress bar per epoch")
    args = parser.parse_args()

    gpus = tf.config.list_logical_devices("GPU")
    devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
    strategy = tf.distribute.MirroredStrategy(devices)
    replicas = strategy.num_replicas_in_sync
    print(f"devices {', '.join(devices)}", flush=True)
    print(f"replicas in sync {replicas}", flush=True)
    if args.expect_replicas is not None and replicas != args.expect_replicas:
        print(f"error: expected {args.expect_replicas} replicas in sync, got {replicas}", file=sys.stderr, flush=True)
        return 2

    tf.keras.utils.set_random_seed(args.seed)
    x, y = make_data(args.seed)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(EXAMPLES, seed=args.seed)
        .batch(args.batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )

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

    history = model.fit(dataset, epochs=args.epochs, verbose=args.verbose)
    print(f"final loss {history.history['loss'][-1]:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
