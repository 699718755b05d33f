"""A task uid goes to another job only once it is empty: every process it owns is killed first.

A task can leave processes its process group no longer holds (a double fork and `setsid`). When the last task of a job
ends on this host, the agent kills every process whose real or saved uid is the job's: a short-lived child drops to
that uid and calls kill(-1, SIGKILL), which reaches exactly the processes that uid may signal (those whose real or
saved uid it is), repeated until /proc lists none of them alive. (cgroup v2's cgroup.kill would do the same where the
agent has a delegated cgroup; this needs only root.)

Several agents on one machine (the local cluster) can hold one uid for one job (its tasks on two of them): each holds a
shared flock on `/run/tfdash-agent/uid-<uid>.lock` while it does, and only an agent that gets the lock exclusively
empties the uid, so no agent kills another's running task; the last one out empties it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

LOCK_DIR = Path("/run/tfdash-agent")
EMPTY_TIMEOUT_S = 10.0
KILLER_TIMEOUT_S = 30.0
_GONE_POLL_S = 0.01
_ROUND_S = 1.0  # how long one kill round waits for its targets to be gone before the next
# Run as the uid: kill(-1) signals every process that uid may signal, except the caller itself.
KILL = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept ProcessLookupError:\n    pass\n"


def alive(owned: Callable[[int], bool]) -> dict[int, list[int]]:
    """uid -> pids of the processes alive (zombies are over) whose real or saved uid `owned` accepts: one /proc scan."""
    found: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["uids", "status"]):
        uids, status = proc.info["uids"], proc.info["status"]
        if uids is None or status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            continue
        for uid in {uids.real, uids.saved}:
            if owned(uid):
                found.setdefault(uid, []).append(proc.pid)
    return found


def empty(uid: int, timeout: float = EMPTY_TIMEOUT_S) -> list[int]:
    """Kill every process of `uid`; returns the pids still alive at the deadline (none: it is empty)."""
    deadline = time.monotonic() + timeout
    rounds = 0
    while left := alive(uid.__eq__).get(uid, []):
        if time.monotonic() >= deadline:
            return left
        rounds += 1
        if rounds == 1:
            log.info("uid %s still owns %d process(es) (e.g. a task's setsid child): killing them", uid, len(left))
        _kill_as(uid)
        _wait_gone(uid, min(deadline, time.monotonic() + _ROUND_S))
    return []


def run_python(code: str, *args: str, timeout: float, uid: int | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run `code` in a short child interpreter from a fixed environment (`env={}`, `-I -S`, cwd /, no stdin; output
    captured): it runs as root or as a task uid, and nothing of a job may reach it. As `uid` (its group, no other
    groups) when given. Raises OSError or SubprocessError (its timeout) as subprocess.run does."""
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, *args],
        user=uid,  # None: subprocess's own defaults, the caller's user and groups
        group=uid,
        extra_groups=None if uid is None else [],
        env={},
        cwd="/",
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def _kill_as(uid: int) -> None:
    try:
        run_python(KILL, timeout=KILLER_TIMEOUT_S, uid=uid)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not start a killer as uid %s: %s", uid, exc)


def _wait_gone(uid: int, until: float) -> None:
    while alive(uid.__eq__) and time.monotonic() < until:
        time.sleep(_GONE_POLL_S)


class UidLock:
    """A flock on the uid's lock file, machine-wide: shared while an agent holds the uid for a job, exclusive while
    one empties it."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self._fd: int | None = fd

    @classmethod
    def shared(cls, uid: int) -> UidLock:
        """Held for a job; waits while another agent empties the uid."""
        fd = _open_lock(uid)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return cls(uid, fd)

    @classmethod
    def exclusive(cls, uid: int) -> UidLock | None:
        """Held alone, if no agent on this machine holds the uid; else None. Never waits."""
        lock = cls(uid, _open_lock(uid))
        if not lock.alone():
            lock.close()
            return None
        return lock

    def alone(self) -> bool:
        """Whether no other agent holds the uid; then this one holds it exclusively until `close` (a shared lock
        that fails to become exclusive is given up: the caller is letting go of it anyway)."""
        assert self._fd is not None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def share(self) -> None:
        """From exclusive to shared (held for a job after emptying it alone); waits while another agent empties it."""
        assert self._fd is not None
        fcntl.flock(self._fd, fcntl.LOCK_SH)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _open_lock(uid: int) -> int:
    LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    return os.open(LOCK_DIR / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
