"""The runtime set, as a task process sees it: a copy under the agent's workdir that every task's PYTHONPATH names.

What runs inside a TF task process (the metrics hook, the builtin programs, `from worker_agent import report`, the
environment probe) is the runtime set: RUNTIME_SET's files, which import only the standard library, each other and
what a task environment has (TensorFlow, Keras or tf_keras, numpy), on Python 3.9 and later
(tests/worker_agent/test_runtime_set.py holds them to that). A task runs in its environment's interpreter, not the
agent's, so the agent copies the set to `<workdir>/runtime/<content hash>/` once per content, and the task's path
names that copy: the agent's own site-packages and checkout (Celery, Django, cryptography, its token-handling
code...) are on no task's path.

The copy is made in a temporary folder and renamed into place, so a task never sees half of one; folders are 0755 and
files 0644, owned by the agent's user, so task uids read it and none can change it. Copies of an older content are
removed once they are a week old (a running task may still import from the one it started with).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # the folder holding `worker_agent` and `contracts`
# Relative to PACKAGE_ROOT: single files, or folders taken whole (less caches).
RUNTIME_SET: tuple[str, ...] = (
    "worker_agent/__init__.py",
    "worker_agent/report.py",
    "worker_agent/runtime",
    "worker_agent/hooks",
    "contracts/__init__.py",
    "contracts/task_wire.py",
    "contracts/run_config.py",
    "contracts/batching.py",
    "contracts/strategies.py",
    "contracts/programs.py",
)
HOOKS_IN_ROOT = Path("worker_agent", "hooks")
FOLDER = "runtime"
KEEP_OLD_S = 7 * 24 * 3600
_DIR_MODE = 0o755
_FILE_MODE = 0o644
_lock = threading.Lock()


def runtime_files(source: Path = PACKAGE_ROOT) -> list[Path]:
    """The runtime set's files, relative to `source`, sorted."""
    found: set[Path] = set()
    for entry in RUNTIME_SET:
        path = source / entry
        if path.is_dir():
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
                for name in filenames:
                    if not name.endswith((".pyc", ".pyo")) and not name.startswith("."):
                        found.add(Path(dirpath, name).relative_to(source))
        elif path.is_file():
            found.add(Path(entry))
        else:
            raise FileNotFoundError(f"the runtime set's {entry} is missing under {source}")
    return sorted(found)


def content_hash(source: Path = PACKAGE_ROOT) -> str:
    digest = hashlib.sha256()
    for relative in runtime_files(source):
        data = (source / relative).read_bytes()
        digest.update(f"{relative.as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:20]


def runtime_root(workdir: Path, source: Path = PACKAGE_ROOT) -> Path:
    """The copy of the runtime set for its current content under `workdir`, made if missing."""
    folder = workdir / FOLDER
    target = folder / content_hash(source)
    if target.is_dir():
        return target
    with _lock:
        if target.is_dir():
            return target
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(_DIR_MODE)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder))
        try:
            for relative in runtime_files(source):
                _copy(source / relative, staging / relative, staging)
            staging.chmod(_DIR_MODE)
            try:
                staging.rename(target)
            except OSError:
                if not target.is_dir():  # not another agent process on the same workdir having won the race
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _remove_old(folder, keep=target)
    return target


def runtime_pythonpath(workdir: Path) -> list[str]:
    """Folders for a task's PYTHONPATH, in this order: the hooks (their sitecustomize runs first in every task
    process), then the copy's root (`worker_agent`, `contracts`: `-m worker_agent.runtime`, `from worker_agent import
    report`)."""
    root = runtime_root(workdir)
    return [str(root / HOOKS_IN_ROOT), str(root)]


def _copy(source: Path, destination: Path, top: Path) -> None:
    parent = destination.parent
    if not parent.is_dir():
        parent.mkdir(parents=True)
        for folder in (parent, *parent.parents):
            if folder == top:
                break
            folder.chmod(_DIR_MODE)
    shutil.copyfile(source, destination)
    destination.chmod(_FILE_MODE)


def _remove_old(folder: Path, keep: Path) -> None:
    now = time.time()
    for entry in folder.iterdir():
        if entry == keep or not entry.is_dir():
            continue
        # A staging folder an hour old was left by a crash; a newer one may be being filled by another process.
        limit = 3600 if entry.name.startswith(".staging-") else KEEP_OLD_S
        try:
            stale = entry.stat().st_mtime < now - limit
        except OSError:
            continue
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
