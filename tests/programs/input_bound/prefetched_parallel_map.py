"""The same map, run in parallel (PARALLEL_CALLS, 16) and prefetched: its batches are made while the model computes."""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BATCH, EPOCHS, PARALLEL_CALLS, examples, model, slow_decode

net = model()
data = examples().batch(BATCH).map(slow_decode, num_parallel_calls=PARALLEL_CALLS).prefetch(tf.data.AUTOTUNE)
# Threads for the parallel calls to run on: tf.data's own pool has one per core, and a sleeping py_function holds one
# (on a loaded 2-core machine two sleeps at a time could not keep up with the model, and it read highly input-bound).
options = tf.data.Options()
options.threading.private_threadpool_size = PARALLEL_CALLS
data = data.with_options(options)
net.fit(data, epochs=EPOCHS, verbose=0)
