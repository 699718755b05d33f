"""Out of device memory: a tensor larger than its device can hold. TensorFlow's allocator refuses it with
`ResourceExhaustedError: OOM when allocating tensor with shape[...]` (here on the CPU device of a machine with no GPU:
the same error from the same allocator check a GPU's BFC allocator raises)."""

from __future__ import annotations

import tensorflow as tf

if __name__ == "__main__":
    print(f"tensorflow {tf.__version__}", flush=True)
    activations = tf.zeros([1 << 22, 1 << 22], dtype=tf.float32)  # 64 TiB
    print(activations.shape)
