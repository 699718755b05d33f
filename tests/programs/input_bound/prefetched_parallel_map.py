"""The same map, run in parallel (PARALLEL_CALLS, 16) and prefetched: its batches are made while the model computes."""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BATCH, EPOCHS, PARALLEL_CALLS, examples, model, slow_decode

data = examples().batch(BATCH).map(slow_decode, num_parallel_calls=PARALLEL_CALLS).prefetch(tf.data.AUTOTUNE)
model().fit(data, epochs=EPOCHS, verbose=0)
