"""The job folder: training-state backups for resuming a restarted gang, and the final model.

Layout under the job folder (env TFDASH_JOB_DIR; default ./job in the task's working directory):
- checkpoints/: tf_keras `BackupAndRestore(backup_dir=...)`, one directory shared by every task of the job. TensorFlow
  itself lets only the chief write there (checkpoints/chief/) and gives other MultiWorkerMirrored workers temporary
  folders (checkpoints/workertemp_<index>/) that it removes after each save, because every worker must take part
  in a save. Backups are taken at each epoch end, restored by `fit` on a restart, and deleted when `fit` completes.
  With legacy Keras (tf_keras, Keras 2) one is also taken at the next step after a stop's SIGTERM (preemption.py),
  and a restarted `fit` goes on at the step after it.
- artifacts/model.keras: the trained model, one file, written by the chief only (temp name, then an atomic rename).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from contracts.task_wire import JOB_DIR_ENV

MODEL_NAME = "model.keras"


def job_dir(environ: Any = os.environ) -> Path:
    path = Path(environ.get(JOB_DIR_ENV) or "job").expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def backup_dir(job: Path) -> Path:
    return job / "checkpoints"


def backup_callback(keras: Any, job: Path, *, at_stop: bool) -> Any:
    """Backups at each epoch end; `at_stop` (legacy Keras only, preemption.enable_for done) also at a stop's step."""
    if at_stop:
        return keras.callbacks.BackupAndRestore(backup_dir=str(backup_dir(job)), save_before_preemption=True)
    return keras.callbacks.BackupAndRestore(backup_dir=str(backup_dir(job)))


def save_model(model: Any, job: Path, *, is_chief: bool, task_name: str) -> Path | None:
    """Save the model; the chief's copy goes to artifacts/ and its path is returned.

    Every MultiWorkerMirrored worker calls this (reading some variables may take a collective); a non-chief one saves
    to a temporary folder that it deletes at once, the pattern TensorFlow's multi-worker guide prescribes.
    """
    if not is_chief:
        scratch = job / "checkpoints-tmp" / task_name
        scratch.mkdir(parents=True, exist_ok=True)
        try:
            model.save(str(scratch / MODEL_NAME))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None
    artifacts = job / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    final = artifacts / MODEL_NAME
    # Keras insists on the .keras suffix, so the temporary file keeps it.
    fd, tmp = tempfile.mkstemp(dir=artifacts, prefix=".model-", suffix=".keras")
    os.close(fd)
    try:
        model.save(tmp)
        os.chmod(tmp, 0o644)  # mkstemp made it private; the agent (maybe another user) uploads it
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return final
