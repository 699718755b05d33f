# TensorFlow's tutorial "Parameter server training with ParameterServerStrategy"
# (https://www.tensorflow.org/tutorials/distribute/parameter_server_training), its Model.fit path, as a script the
# tasks of a real cluster run (the tutorial starts its in-process cluster with portpicker instead; here TF_CONFIG
# gives the cluster). Unmodified where it counts: the same model, data, callbacks, and working directory under /tmp,
# which each task of a job resolves on its own host (tfdash gives every task a /tmp of its own). A few steps only.
import os

import tensorflow as tf

cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if cluster_resolver.task_type in ("worker", "ps"):
    # Start a TensorFlow server and wait.
    server = tf.distribute.Server(
        cluster_resolver.cluster_spec(),
        job_name=cluster_resolver.task_type,
        task_index=cluster_resolver.task_id,
        protocol=cluster_resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()

NUM_PS = len(cluster_resolver.cluster_spec().as_dict().get("ps", []))

variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=(256 << 10), max_shards=NUM_PS
)

strategy = tf.distribute.ParameterServerStrategy(cluster_resolver, variable_partitioner=variable_partitioner)

global_batch_size = 64

x = tf.random.uniform((10, 10))
y = tf.random.uniform((10,))

dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
dataset = dataset.batch(global_batch_size)
dataset = dataset.prefetch(2)

with strategy.scope():
    model = tf.keras.models.Sequential([tf.keras.layers.Dense(10)])

    model.compile(tf.keras.optimizers.legacy.SGD(), loss="mse", steps_per_execution=10)

working_dir = "/tmp/my_working_dir"
log_dir = os.path.join(working_dir, "log")
ckpt_filepath = os.path.join(working_dir, "ckpt")
backup_dir = os.path.join(working_dir, "backup")

callbacks = [
    tf.keras.callbacks.TensorBoard(log_dir=log_dir),
    tf.keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
    tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir),
]

model.fit(dataset, epochs=2, steps_per_epoch=20, callbacks=callbacks)
