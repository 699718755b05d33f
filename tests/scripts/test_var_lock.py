"""scripts/var_lock.py: one `make run` per var/ folder; a second refuses naming the first's pid; a lock file left by a
killed run blocks nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.support.processes import ROOT, wait_until

sys.path.insert(0, str(ROOT / "scripts"))
# scripts/ is no package: found through the path above
import var_lock


def test_a_second_hold_on_a_held_folder_refuses_naming_the_holder_and_the_folder_is_free_once_it_is_closed(tmp_path):
    var = tmp_path / "var"
    first = var_lock.hold(var)
    try:
        with pytest.raises(SystemExit) as refused:
            var_lock.hold(var)  # flock is per open file: a second open in this same process conflicts too
        message = str(refused.value.code)
        assert message.startswith(f"{var} is in use by another `make run` (pid {os.getpid()}): stop it first")
        assert f"`kill {os.getpid()}`" in message and "nothing was started" in message
        assert oct((var / "run.lock").stat().st_mode & 0o777) == oct(0o600)
    finally:
        first.close()
    var_lock.hold(var).close()


def test_a_lock_left_by_a_sigkilled_holder_blocks_nothing(tmp_path):
    var = tmp_path / "var"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            sys.path.insert(0, {str(ROOT / "scripts")!r})
            import var_lock
            lock = var_lock.hold(var_lock.Path({str(var)!r}))
            print("held", flush=True)
            time.sleep(600)
        """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(SystemExit, match=rf"\(pid {holder.pid}\): stop it first"):
            var_lock.hold(var)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert (var / "run.lock").read_text() == f"{holder.pid}\n"  # the file stays, with the dead run's pid
    lock = wait_until(lambda: _hold_or_none(var), timeout=10, what="the lock free")
    assert (var / "run.lock").read_text() == f"{os.getpid()}\n"
    lock.close()


def test_a_folder_held_by_what_a_gone_run_started_says_so():
    gone = subprocess.Popen(["true"])
    gone.wait()
    message = var_lock.in_use_message(ROOT / "var", gone.pid)
    assert f"(pid {gone.pid}) that is gone: what it started is still stopping" in message


def _hold_or_none(var):
    try:
        return var_lock.hold(var)
    except SystemExit:
        return None
