"""ParameterServerStrategy with a ClusterCoordinator custom training loop; the cluster comes from TF_CONFIG.

Worker and ps tasks start a ``tf.distribute.Server`` and serve until killed. The chief builds the model, schedules
``--steps`` training steps onto the workers, prints ``step <n> loss <value>`` every ``--log-every`` steps and finally
``final loss <value>``, then exits 0. The loss printed is that of the last step scheduled.

Works with legacy Keras (``TF_USE_LEGACY_KERAS=1``) and with Keras 3 alike.
"""

from __future__ import annotations

import argparse

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


def serve(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> None:
    """Worker or ps: host this task's server; the chief drives it. Never returns."""
    print(f"{resolver.task_type} {resolver.task_id}: serving", flush=True)
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()


def train(resolver: tf.distribute.cluster_resolver.ClusterResolver, args: argparse.Namespace) -> None:
    """Chief: coordinate training over the workers, with variables on the ps tasks."""
    num_ps = len(resolver.cluster_spec().as_dict().get("ps", []))
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=max(num_ps, 1)
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    x, y = make_data(args.seed)

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch_size = input_context.get_per_replica_batch_size(args.batch_size)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(EXAMPLES, seed=args.seed).repeat()
        return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)

    tf.keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(FEATURES,)),
                tf.keras.layers.Dense(32, activation="relu"),
                tf.keras.layers.Dense(CLASSES),
            ]
        )
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def step(iterator: tf.distribute.DistributedIterator) -> tf.Tensor:
        def replica_fn(batch: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
            features, labels = batch
            with tf.GradientTape() as tape:
                logits = model(features, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(labels, logits), global_batch_size=args.batch_size)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        losses = strategy.run(replica_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    @tf.function
    def per_worker_dataset_fn() -> tf.distribute.DistributedDataset:
        return strategy.distribute_datasets_from_function(dataset_fn)

    # Each worker builds its own copy of the input pipeline.
    per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
    per_worker_iterator = iter(per_worker_dataset)

    print(f"chief: {len(resolver.cluster_spec().as_dict().get('worker', []))} workers, {num_ps} ps", flush=True)
    loss = None
    done = 0
    while done < args.steps:
        chunk = min(args.log_every, args.steps - done)
        for _ in range(chunk):
            loss = coordinator.schedule(step, args=(per_worker_iterator,))
        coordinator.join()  # wait for every scheduled step
        done += chunk
        print(f"step {done} loss {loss.fetch():.6f}", flush=True)
    print(f"final loss {loss.fetch():.6f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        serve(resolver)
    else:
        train(resolver, args)


if __name__ == "__main__":
    main()
