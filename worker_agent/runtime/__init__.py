"""The TF-side training runtime: builtin programs, strategy from TF_CONFIG, metrics to the agent, checkpoints.

Importing this package imports no TensorFlow: the injected hook and `worker_agent.report` use its TF-free modules
(`emitter`, `metrics`) in processes that may never need TensorFlow. The entry point is `python -m worker_agent.runtime`
(see `train.py`); `python -m worker_agent.runtime.probe` tells the agent what an environment's TensorFlow is and which
GPUs it sees (`probe.py`, `flavour.py`).

Part of the runtime set (worker_agent/supervision/runtime_root.py): it runs in a task environment's own interpreter,
Python 3.9 or newer, and imports only the standard library, the set and what the environment has (TensorFlow, Keras,
numpy); tests/worker_agent/test_runtime_set.py holds it to that.
"""

from __future__ import annotations
