"""What the agent and a TF task process agree on through the task's environment: which variables name its metrics
pipe, its job folder, its TensorBoard folder and a builtin program's config.

Part of the runtime set (worker_agent/supervision/runtime_root.py): it runs inside a task's own interpreter, so it is
standard library only and Python 3.9-compatible.

The metrics pipe: the agent gives every TF process a pipe, named by env METRICS_FD_ENV (a file descriptor number);
the process writes one JSON object per line to it (never to stdout, which is the user's). Each object has a "kind":
  {"kind": "metric", "ts": wall seconds, "mono": monotonic seconds, "step": int, "epoch": int | null,
   "phase": "train" | "epoch_end", "metrics": {"loss": float, "accuracy": float, "examples_per_s": float,
   "step_time_s": float, "learning_rate": float, "val_loss": float, "val_accuracy": float, ...}}
  {"kind": "facts", "ts": ..., "facts": {"replicas_in_sync": int, "global_batch": int, "per_replica_batch": int,
   "machine_batch": int, "per_device_batch": int, "base_learning_rate": float, "effective_learning_rate": float,
   "warmup_epochs": float, "keras": "tf_keras" | "keras3", "checkpoint_dir": str, "resumed_from_epoch": int,
   "resumed_from_step": int (steps of the next epoch done too: a backup saved at a stop's step), ...}}
  {"kind": "artifact", "ts": ..., "name": "model.keras", "path": absolute path of a file the agent uploads; it
   must lie in the job's folders (its JOB_DIR_ENV, or its HOME under the agent's workdir) and be the task's own}
"""

from __future__ import annotations

METRICS_FD_ENV = "TFDASH_METRICS_FD"
JOB_DIR_ENV = "TFDASH_JOB_DIR"
# A folder of the task's own (under its job folder) for TensorBoard summaries it writes itself (tf.summary, the Keras
# TensorBoard callback); when the task ends the agent sends its files as the artifact tensorboard-<type>-<index>.tar.gz.
TENSORBOARD_DIR_ENV = "TFDASH_TENSORBOARD_DIR"
# A builtin program's config (JSON) reaches `python -m worker_agent.runtime` in its environment, not its command line.
PROGRAM_CONFIG_ENV = "TFDASH_PROGRAM_CONFIG"
# Set by the agent on a CPU task: split the first CPU into this many logical devices (worker_agent/hooks/).
LOGICAL_CPU_DEVICES_ENV = "TFDASH_LOGICAL_CPU_DEVICES"
# Set on a preflight's tasks (orchestrator/preflight/): the runtime stops `fit` after this many steps in all
# (worker_agent/runtime/step_bound.py); a custom loop has the preflight's time limit instead.
PREFLIGHT_STEPS_ENV = "TFDASH_PREFLIGHT_STEPS"
