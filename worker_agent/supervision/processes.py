"""Process groups: is a task's process tree listening on its port, waiting for it to exit, signalling its group."""

from __future__ import annotations

import logging
import os
import signal
import subprocess

import psutil

log = logging.getLogger(__name__)


def tree_listens_on(pid: int, port: int) -> bool:
    """Whether the process or any of its descendants has a TCP socket LISTENing on `port`."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    for proc in procs:
        try:
            connections = proc.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections):
            return True
    return False


def wait_for_exit(proc: subprocess.Popen[bytes]) -> None:
    """Block until the child exits, leaving it a zombie so its pid (= its group id) stays reserved until reaped."""
    if hasattr(os, "waitid") and hasattr(os, "WNOWAIT"):
        try:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            return
        except ChildProcessError:  # already reaped elsewhere: Popen.wait copes
            pass
    proc.wait()  # no waitid (macOS): reaped now, so the group kill after it is best effort


def killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the whole group is already gone
        pass
    except PermissionError as exc:
        log.warning("could not signal process group %s: %s", pgid, exc)
