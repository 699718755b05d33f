"""The processes `make run` starts (scripts/run_local.py): each in a session of its own, tethered so that it cannot
outlive `make run` (scripts/tether.py), its output to var/log/<name>.log; one that exits is started again after a
pause (`Backoff`: 1 s, doubling to 30 s while it keeps failing, 1 s again once it ran a minute), and at the end the
programs stop first, then the servers they talk to. `session_nice` sets a session's CPU weight where allowed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
GRACE_S = 10.0  # from SIGTERM to SIGKILL, on Ctrl-C and in a guard whose `make run` died
# A guard SIGKILLs what is left GRACE_S after SIGTERM; this script SIGKILLs a guard (its last resort) this much later.
GUARD_MARGIN_S = 5.0
TETHER = ROOT / "scripts" / "tether.py"


class Backoff:
    """The pause before a child that exited is started again: `first_s`, doubling up to `most_s` while it keeps
    exiting, and `first_s` again once it had run `stable_s` (a crash after an hour is not a crash loop)."""

    def __init__(self, first_s: float = 1.0, most_s: float = 30.0, stable_s: float = 60.0) -> None:
        self.first_s, self.most_s, self.stable_s = first_s, most_s, stable_s
        self._next = first_s

    def after_exit(self, ran_s: float) -> float:
        """The pause before the next start of a child that ran `ran_s` before it exited."""
        if ran_s >= self.stable_s:
            self._next = self.first_s
        pause, self._next = self._next, min(self._next * 2, self.most_s)
        return pause


def tethered(argv: list[str], name: str, *, childless: bool, hold_fd: int | None = None) -> list[str]:
    """`argv` started through scripts/tether.py, so that it ends when this process does, SIGKILL included.

    `childless`: a program that starts no process of its own is exec'ed in place (SIGKILL when this process dies).
    Any other gets a guard that stays its parent: SIGTERM, then SIGKILL after GRACE_S to everything below it, however
    it got there (an agent's TF processes run in sessions of their own and ignore SIGTERM; celery -B forks beat;
    PostgreSQL its backends). `hold_fd`: the var/ lock, kept by a guard until its processes are gone.

    Start it from a thread that lives as long as this process (here: the main thread): the kernel sends the
    parent-death signal when the thread that forked the child ends, not only the process."""
    if sys.platform != "linux":  # prctl is Linux's: elsewhere, started as before, without that guarantee
        return argv
    line = [PY, "-I", str(TETHER), "--parent", str(os.getpid()), "--name", name]
    if not childless:
        line += ["--guard", "--grace", f"{GRACE_S:g}"]
        if hold_fd is not None:
            line += ["--hold-fd", str(hold_fd)]
    return [*line, "--", *argv]


class Child:
    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], log_dir: Path, *, nice: int | None = None,
        childless: bool = False, stops_last: bool = False, hold_fd: int | None = None, **options: Any,
    ) -> None:  # fmt: skip
        self.name = name
        self.argv, self.env, self.options = argv, env, options
        self.nice = nice  # its session's CPU nice (session_nice), when given
        self.childless, self.hold_fd = childless, hold_fd  # how it is tethered to this process (tethered())
        self.stops_last = stops_last  # a server the others talk to (Children.stop_all)
        self.log_path = log_dir / f"{name}.log"
        self.log: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115 - the child writes to it until stop()
        self.backoff = Backoff()
        self.restart_at: float | None = None  # set while it waits to be started again
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.started_at = time.monotonic()
        # Own session: Ctrl-C in the terminal reaches only this script, which then stops children in order.
        # Tethered: it cannot outlive this script, and an exec wrapper arms that, not a preexec_fn.
        argv = tethered(self.argv, self.name, childless=self.childless, hold_fd=self.hold_fd)
        guarded = not self.childless and argv is not self.argv  # (not tethered at all where there is no prctl)
        pass_fds = (self.hold_fd,) if self.hold_fd is not None and guarded else ()
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            pass_fds=pass_fds, **self.options,
        )  # fmt: skip
        if self.nice is not None:
            session_nice(proc.pid, self.nice)
        return proc

    def restart(self) -> None:
        """Start it again, once whatever its last run left in its process group (a beat child) is gone."""
        self.signal(signal.SIGKILL)
        self.proc = self._spawn()

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, deadline: float) -> None:
        """Wait for it to end after SIGTERM until `deadline`, then SIGKILL its group. A guard SIGKILLs what is below
        it GRACE_S after SIGTERM by itself: the deadline leaves it GUARD_MARGIN_S for that (stop_all)."""
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        # Whatever else is left in its group (a TF process under an agent, a beat child) goes too.
        self.signal(signal.SIGKILL)
        self.log.close()


def session_nice(pid: int, nice: int) -> None:
    """Set the CPU nice of the session `pid` leads, where this kernel and this user can (`session_nice_of` says what
    the kernel made of it).

    Every child leads a session of its own, and with autogroups on (`kernel.sched_autogroup_enabled`, the default of
    many distribution kernels) Linux shares the CPU between sessions first: a process's own nice counts only inside
    its session, so `nice`/`renice` on the scheduler did nothing against the rest of the control plane (docs/sizing.md).
    The session's nice is what weighs (`/proc/PID/autogroup`; below 0 needs root or CAP_SYS_NICE)."""
    # No autogroups (then a process's nice is what counts), or not allowed: equal shares.
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def session_nice_of(pid: int) -> int | None:
    """The CPU nice of the session `pid` is in (None: no autogroups on this kernel)."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])  # "/autogroup-123 nice -10"
    except (OSError, IndexError, ValueError):
        return None


class Children:
    """The processes `make run` started: one that exits is started again after its backoff (and that is said), all
    of them are stopped at the end."""

    def __init__(self, log_dir: Path, say: Callable[[str], None], hold_fd: int | None = None) -> None:
        self.log_dir = log_dir
        self.say = say
        self.hold_fd = hold_fd  # the var/ lock, which every guard keeps too (tethered())
        self.all: list[Child] = []
        self.stopping = False

    def start(self, name: str, argv: list[str], env: dict[str, str], **options: Any) -> Child:
        child = Child(name, argv, env, self.log_dir, hold_fd=self.hold_fd, **options)
        self.all.append(child)
        return child

    def tend(self, now: float | None = None) -> None:
        """One look at every child: one that exited is given its restart time, one whose time came is started."""
        now = time.monotonic() if now is None else now
        for child in self.all:
            if self.stopping:
                return
            if child.restart_at is None:
                code = child.proc.poll()
                if code is None:
                    continue
                pause = child.backoff.after_exit(now - child.started_at)
                child.restart_at = now + pause
                self.say(f"{child.name} exited with code {code}; restarting in {pause:g} s (log: {child.log_path})")
            elif now >= child.restart_at:
                child.restart_at = None
                child.restart()
                self.say(f"{child.name} restarted (pid {child.proc.pid})")

    def stop_all(self) -> None:
        """The programs first, then the servers they talk to (`stops_last`): an agent stopping kills its tasks and
        reports their exits, which must still find Redis (stopped together, they were lost: "broker unreachable")."""
        self.stopping = True
        for stage in ([c for c in self.all if not c.stops_last], [c for c in self.all if c.stops_last]):
            for child in reversed(stage):
                child.signal(signal.SIGTERM)
            deadline = time.monotonic() + GRACE_S + GUARD_MARGIN_S
            for child in reversed(stage):
                child.stop(deadline)
