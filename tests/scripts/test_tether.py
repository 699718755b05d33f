"""scripts/tether.py: what `make run` starts ends with it, SIGKILL included, grandchildren in sessions of their own
(an agent's TF processes) and processes that ignore SIGTERM (TF while it trains) included.

Each test starts a stand-in for `make run` (a Python process that starts one program through the tether and prints
its pid), lets the whole tree come up, SIGKILLs the stand-in, and waits for every process of the tree to be gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.support.processes import ROOT, wait_until

TETHER = ROOT / "scripts" / "tether.py"
# A TF task's stand-in: a session of its own, SIGTERM ignored (TF_NOTES.md, "Processes, ports, signals").
TASK = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="prctl (the parent-death signal) is Linux's")


def agent(on_sigterm: str) -> str:
    """An agent's stand-in: one task in a session of its own and one helper in its group, then `on_sigterm`."""
    return textwrap.dedent(
        f"""
        import signal, subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", {TASK!r}], start_new_session=True)
        subprocess.Popen(["sleep", "600"])
        signal.signal(signal.SIGTERM, {on_sigterm})
        time.sleep(600)
        """
    )


def start_parent(tether_args: list[str], program: list[str]) -> subprocess.Popen[str]:
    """`make run`'s stand-in: starts `program` through the tether (as run_local.py does: a session of its own)."""
    code = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        argv = [sys.executable, "-I", {str(TETHER)!r}, "--parent", str(os.getpid()), "--name", "t", *{tether_args!r},
                "--", *{program!r}]
        print(subprocess.Popen(argv, start_new_session=True).pid, flush=True)
        time.sleep(600)
        """
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def tree(pid: int, size: int) -> list[psutil.Process]:
    """Every process below `pid` once there are `size` of them."""

    def grown() -> list[psutil.Process] | None:
        below = psutil.Process(pid).children(recursive=True)
        return below if len(below) >= size else None

    return wait_until(grown, timeout=60, what=f"{size} processes below pid {pid}")


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_end(processes: list[psutil.Process]) -> None:
    try:
        wait_until(lambda: not [p for p in processes if alive(p)], timeout=60, what="every process of the tree gone")
    finally:
        for process in processes:
            if alive(process):
                process.kill()


@pytest.mark.parametrize(
    "on_sigterm",
    [
        "lambda *_: sys.exit(0)",  # ends at once, leaving its task behind (as a SIGKILLed agent would)
        "signal.SIG_IGN",  # does not end at all: SIGKILL after the grace
    ],
    ids=["leaves-its-task", "ignores-sigterm"],
)
def test_a_guarded_program_and_everything_below_it_end_when_make_run_is_sigkilled(on_sigterm):
    parent = start_parent(["--guard", "--grace", "1"], [sys.executable, "-c", agent(on_sigterm)])
    try:
        # guard, agent, its task (own session) and its helper
        processes = tree(parent.pid, 4)
        assert len({p.pid for p in processes if p.pid == os.getsid(p.pid)}) == 2  # the guard's session, the task's
    finally:
        parent.kill()
        parent.wait()
    assert_all_end(processes)


def test_an_exec_tethered_program_ends_when_make_run_is_sigkilled():
    parent = start_parent([], ["sleep", "600"])
    try:
        [program] = tree(parent.pid, 1)
        wait_until(lambda: program.name() == "sleep", timeout=30, what="the tether to exec sleep in its place")
        assert program.ppid() == parent.pid  # no process in between
    finally:
        parent.kill()
        parent.wait()
    assert_all_end([program])


@pytest.mark.parametrize("mode", [[], ["--guard"]], ids=["exec", "guard"])
def test_a_tether_whose_parent_died_before_it_was_armed_starts_nothing(tmp_path, mode):
    marker = tmp_path / "started"
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that is not our parent (the tether is ours): as after the parent died and we were re-parented
    result = subprocess.run(
        [sys.executable, "-I", str(TETHER), "--parent", str(gone.pid), "--name", "late", *mode,
         "--", "touch", str(marker)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 70
    assert f"make run (pid {gone.pid}) is gone: not starting" in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    ("script", "expected"), [("exit 3", 3), ("kill -9 $$", -signal.SIGKILL)], ids=["exit-code", "signal"]
)
def test_a_guard_ends_as_its_program_did_and_keeps_no_environment(tmp_path, script, expected):
    """make run reports a guard's end as its program's ("orchestrator exited with code -9"); and a guard keeps no
    copy of the environment it passed on (an agent's token) in /proc/<pid>/environ."""
    secret = "token-that-must-not-stay"
    os.mkfifo(tmp_path / "go")  # the program ends when told, after the looks below
    guard = subprocess.Popen(
        [sys.executable, "-I", str(TETHER), "--parent", str(os.getpid()), "--name", "g", "--guard",
         "--", "sh", "-c", f"read _ <{tmp_path / 'go'}; {script}"],
        env={**os.environ, "SOME_TOKEN": secret},
    )  # fmt: skip
    try:
        wait_until(lambda: len(psutil.Process(guard.pid).children()) == 1, timeout=30, what="the guard's program")
        wait_until(
            lambda: secret.encode() not in Path(f"/proc/{guard.pid}/environ").read_bytes(),
            timeout=30,
            what="the guard's environment blanked",
        )
        [program] = psutil.Process(guard.pid).children()
        assert program.environ()["SOME_TOKEN"] == secret  # passed on intact
        (tmp_path / "go").write_text("\n")
        assert guard.wait(timeout=30) == expected
    finally:
        guard.kill()
        guard.wait()
