"""Highly input-bound: a map that sleeps via tf.py_function, with no parallel calls and no prefetch: every step
waits while its batch is made."""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BATCH, EPOCHS, examples, model, slow_decode

net = model()
data = examples().batch(BATCH).map(slow_decode)
options = tf.data.Options()
options.experimental_optimization.inject_prefetch = False  # no prefetch at all, not even the one tf.data adds itself
data = data.with_options(options)
net.fit(data, epochs=EPOCHS, verbose=0)
