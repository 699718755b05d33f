"""Prints how many logical CPU devices TensorFlow sees (the agent's sitecustomize splits the CPU)."""

import tensorflow as tf

print(f"logical cpus: {len(tf.config.list_logical_devices('CPU'))}")
