"""MultiWorkerMirroredStrategy training on a data file whose path comes from the job's environment (DATA), with
the imports a TF script commonly makes checked inside the task: tensorboard, tf.summary (written and read back with
TensorBoard's own event reader), tf_keras and numpy.

Prints `runtime ok: ...` once the imports and the summary round trip work, and `final loss <value>` at the end.
Needs legacy Keras (TF_USE_LEGACY_KERAS=1, the default): Keras 3's model.fit does not run under this strategy.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import tensorboard
import tensorflow as tf
import tf_keras
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def check_runtime(task: str) -> None:
    folder = os.path.join(os.environ.get("TFDASH_JOB_DIR") or tempfile.mkdtemp(), "summaries", task)
    writer = tf.summary.create_file_writer(folder)
    with writer.as_default():
        tf.summary.scalar("probe", 0.25, step=3)
    writer.flush()
    events = EventAccumulator(folder)
    events.Reload()
    [probe] = [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors("probe")]
    assert probe == 0.25, probe
    assert tf.keras.Model is tf_keras.Model, "tf.keras is not tf_keras: TF_USE_LEGACY_KERAS is off"
    print(
        f"runtime ok: tensorboard {tensorboard.__version__}, tf_keras {tf_keras.__version__}, "
        f"numpy {np.__version__}, summary read back {probe}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    task = f"{resolver.task_type or 'worker'}-{resolver.task_id or 0}"
    check_runtime(task)

    path = os.environ["DATA"]
    with np.load(path) as data:
        x, y = data["x_train"].astype("float32"), data["y_train"].astype("int64")
    print(f"DATA={path}: {len(x)} examples, {x.shape[1]} features", flush=True)

    tf.keras.utils.set_random_seed(7)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=7).batch(64).with_options(options)
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(x.shape[1],)),
                tf.keras.layers.Dense(64, activation="relu"),
                tf.keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.Adam(0.01),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    history = model.fit(dataset, epochs=args.epochs, verbose=2)
    print(f"final loss {history.history['loss'][-1]:.6f}", flush=True)


if __name__ == "__main__":
    main()
