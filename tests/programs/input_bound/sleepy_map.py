"""Highly input-bound: a map that sleeps via tf.py_function, with no parallel calls and no prefetch of its own: the
map makes one batch at a time, slower than the model steps, so every step waits for its batch."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BATCH, EPOCHS, examples, model, slow_decode

data = examples().batch(BATCH).map(slow_decode)
model().fit(data, epochs=EPOCHS, verbose=0)
