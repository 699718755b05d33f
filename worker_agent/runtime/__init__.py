"""The TF-side training runtime: builtin programs, strategy from TF_CONFIG, metrics to the agent, checkpoints.

Importing this package imports no TensorFlow: the injected hook and `worker_agent.report` use its TF-free modules
(`emitter`, `metrics`) in processes that may never need TensorFlow. The entry point is `python -m worker_agent.runtime`
(see `train.py`).
"""

from __future__ import annotations
