"""Saving at the next step when a task is stopped: TensorFlow's own `PreemptionCheckpointHandler`, switched on
off Google Cloud for `model.fit` under MultiWorkerMirrored and Mirrored (tf_keras, and Keras 2 of TF <= 2.15).

What TensorFlow does (measured, TF 2.21 + tf_keras 2.21, two MWMS workers on loopback): `BackupAndRestore(...,
save_before_preemption=True)` builds a `tf.distribute.experimental.PreemptionCheckpointHandler`, which installs a
SIGTERM handler; at the next step end every worker agrees on one step (the coordination service), saves the backup
there with the epoch and batch in it, and exits with code 42 (its off-GCP `exit_fn`, `sys.exit(42)`), ~1.5 s after
the signal with 0.1 s steps. One signalled worker is enough: its peers save and exit with it. A restarted `fit`
goes on at the batch after the saved one. But Keras asks `support_on_demand_checkpoint_callback` first, which says
yes only on GCP (it asks GCE's metadata server): elsewhere `save_before_preemption=True` does nothing, and SIGTERM
is ignored as before (TF's own SIGTERM notifier swallows it). `enable_for(flavour)` replaces that gate in the Keras
module's `worker_training_state` so the handler is built for MultiWorkerMirrored (and Mirrored: one process, the
same measured behaviour) wherever it runs. This reaches into
a private module of tf_keras / Keras 2: the name and its use are the same in Keras 2.15 and tf_keras 2.15 to 2.21;
tests/worker_agent/runtime/test_step_preemption.py proves the behaviour on the installed TF.

Not covered (TensorFlow's limits): a ParameterServer cluster (the handler raises NotImplementedError with a `ps`;
Keras skips its per-batch state there), Keras 3 (its `BackupAndRestore` has no preemption saving), and a signal
that comes before `fit` starts or during validation (then the stop's SIGKILL ends it, and it resumes from the last
backup, the epoch end). A custom loop calls the handler itself (docs/user-guide/faults-and-restarts.md).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from worker_agent.runtime.flavour import KERAS2, TF_KERAS

# The exit code of a task that saved at a stop and exited: TensorFlow's default `exit_fn` off GCP (Borg's).
SAVED_AT_STOP_EXIT = 42

_said = False
_enabled: set[str] = set()  # the flavours whose gate enable_for switched

# Where each legacy Keras keeps the GCP gate: tf_keras (TF >= 2.16 with TF_USE_LEGACY_KERAS) and Keras 2 (TF <= 2.15).
_STATE_MODULES = {TF_KERAS: "tf_keras.src.distribute.worker_training_state",
                  KERAS2: "keras.src.distribute.worker_training_state"}  # fmt: skip


def enable_for(flavour: str) -> bool:
    """Let `BackupAndRestore(save_before_preemption=True)` of this Keras save at a SIGTERM under (MultiWorker)Mirrored
    off GCP; True when it now does (False: not a legacy Keras, or its internals moved: nothing is changed)."""
    name = _STATE_MODULES.get(flavour)
    if name is None:  # Keras 3: no preemption saving in its BackupAndRestore
        return False
    try:
        state = importlib.import_module(name)
    except ImportError:
        print(f"tfdash: no {name}: saving at a stop stays off", file=sys.stderr, flush=True)
        return False
    training_state = getattr(state, "WorkerTrainingState", None)
    if not hasattr(state, "support_on_demand_checkpoint_callback") or not hasattr(training_state, "restore"):
        print(f"tfdash: {name} has no preemption gate: saving at a stop stays off", file=sys.stderr, flush=True)
        return False
    state.support_on_demand_checkpoint_callback = _mirrored
    training_state.restore = _restore_from_the_chiefs_backup
    _enabled.add(flavour)
    return True


def saves_at_stop(flavour: str, strategy: Any, callbacks: list[Any]) -> bool:
    """Whether a `fit` with these callbacks saves at a stop's step (a fact for the scheduler's victim choice): the
    gate is on for its Keras, it runs under (MultiWorker)Mirrored, and a backup callback asks for it."""
    # MultiWorkerMirrored's class is CollectiveAllReduceStrategy (TF 2.15 to 2.21); its exported name, in case.
    names = ("MirroredStrategy", "CollectiveAllReduceStrategy", "MultiWorkerMirroredStrategy")
    mirrored = type(strategy).__name__ in names
    asked = any(getattr(callback, "save_before_preemption", False) is True for callback in callbacks)
    return flavour in _enabled and mirrored and asked


def _restore_from_the_chiefs_backup(self: Any) -> None:
    """`WorkerTrainingState.restore` for every worker, with or without saving at a stop.

    Keras' own, with saving at a stop on, restores nothing here and leaves it to the handler it builds, which restores
    from the folder it writes to: on a non-chief worker that is its temporary folder, empty after any epoch-end
    backup (Keras removes it). The chief then restored the backup and the other worker did not, and their next
    collective op failed ("Collective instance 129 expected type 1 and data_type 9 but got ...", measured after a
    SIGKILL). So every worker restores the chief's backup here, as Keras does without saving at a stop, and the
    handler's step counter, which aligns the workers' save step, is taken from that same backup on every worker."""
    self.read_checkpoint_manager.restore_or_initialize()
    handler = getattr(self, "preemption_handler", None)
    if handler is not None:
        handler._run_counter = int(handler._checkpointed_runs.numpy())


def _mirrored(strategy: Any) -> bool:
    """The gate: Keras' own rule (MultiWorkerMirrored) without its GCP test, and MirroredStrategy, which the handler
    runs in its local mode (measured: SIGTERM, exit 42, resumed at the next batch)."""
    import tensorflow as tf  # loaded already: Keras asks only inside `fit`

    return isinstance(strategy, (tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.MirroredStrategy))


def upgrade_backups(callbacks: list[Any]) -> int:
    """A user's own `BackupAndRestore` callbacks (legacy Keras) also save at a stop; the number switched on.

    Their backup directory and epoch-end saves stay as the user wrote them; on a restart `fit` goes on from the step
    after the one saved at the stop. Keras 3's callback has no such argument and is left alone."""
    upgraded = 0
    for callback in callbacks:
        legacy = type(callback).__name__ == "BackupAndRestore" and hasattr(callback, "save_before_preemption")
        if legacy and not callback.save_before_preemption:
            callback.save_before_preemption = True
            upgraded += 1
    return upgraded


def say_saved(last_begun: tuple[int, int]) -> None:
    """On the way out of a `fit` that TensorFlow ended with SAVED_AT_STOP_EXIT: where the backup is, in the task's log,
    once (the builtin runtime and the injected `fit` wrapper both catch the exit). TensorFlow saves at the end of the
    step that began last and exits at once, so that step is the last completed. `last_begun`: (epoch, batch) from 0,
    as the metrics callback saw them."""
    global _said
    if _said:
        return
    _said = True
    epoch, batch = last_begun
    print(
        f"tfdash: stopped by SIGTERM: saved a backup after epoch {epoch + 1}, step {batch + 1} (its last completed); "
        "a restart goes on from the step after it",
        flush=True,
    )
