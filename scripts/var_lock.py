"""One `make run` per var/ folder: a second one on a folder in use refuses at once, naming the pid that holds it.

An flock on `var/run.lock`, taken before anything starts and held for the process's life (and by the guards it
starts: scripts/tether.py --hold-fd, so the folder stays taken until a killed run's processes are all gone). The
kernel drops it with the last descriptor, however the holders end, SIGKILL included: a file left by a killed run
blocks nothing (which a pid file alone would). The holder writes its pid into the file for the message. The file is
never removed: removing it while another process waits to lock it would let two runs lock two different files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import IO

LOCK_NAME = "run.lock"
PID_WAIT_S = 2.0  # a holder writes its pid right after locking; a reader that came between waits this long for it


def hold(var: Path) -> IO[str]:
    """Lock `var` for this process (keep the returned file open for as long as the run lasts), or SystemExit with
    what holds it."""
    var.mkdir(parents=True, exist_ok=True)
    path = var / LOCK_NAME
    # Opened without truncating (it may be another's, still held); held open for the whole run.
    lock = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+")
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise SystemExit(in_use_message(var, holder(path))) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def holder(path: Path) -> int | None:
    """The pid written in a held lock file (None: not written, or not a pid)."""
    deadline = time.monotonic() + PID_WAIT_S
    while True:
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text().strip())
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def in_use_message(var: Path, pid: int | None) -> str:
    where = f"{var} is in use by another `make run`"
    alternative = "or give this one a folder of its own (TFDASH_VAR_DIR=...); nothing was started."
    if pid is None:
        return f"{where} (its pid is not written in {var / LOCK_NAME}): stop it first, {alternative}"
    if not _alive(pid):
        return (
            f"{where} (pid {pid}) that is gone: what it started is still stopping (at most a few seconds more). "
            f"Try again then, {alternative}"
        )
    return f"{where} (pid {pid}): stop it first (Ctrl-C where it runs, or `kill {pid}`), {alternative}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
