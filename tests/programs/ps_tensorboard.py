"""ParameterServerStrategy with tf_keras `model.fit`, the Keras TensorBoard callback and `tf.summary`, writing under
TFDASH_TENSORBOARD_DIR (the folder the product gives each task). The chief trains `--epochs` epochs of
`--steps` steps, then writes one custom scalar per epoch (`custom/lr_seen`) with its own file writer; worker and ps
tasks serve until killed."""

from __future__ import annotations

import argparse
import os

import numpy as np
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        tf.distribute.Server(
            resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id, protocol="grpc"
        ).join()
        return
    logdir = os.environ["TFDASH_TENSORBOARD_DIR"]
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)

    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(2)])
        model.compile(
            optimizer=tf.keras.optimizers.SGD(0.1),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(
        tf.keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=args.epochs,
        steps_per_epoch=args.steps,
        callbacks=[tf.keras.callbacks.TensorBoard(log_dir=logdir, update_freq="epoch")],
        verbose=2,
    )
    writer = tf.summary.create_file_writer(os.path.join(logdir, "custom"))
    with writer.as_default():
        for epoch in range(args.epochs):
            tf.summary.scalar("lr_seen", 0.1 * (epoch + 1), step=epoch)
    writer.flush()
    print("chief done", flush=True)


if __name__ == "__main__":
    main()
