#!/usr/bin/env python
"""Start one of `make run`'s processes so that it cannot outlive `make run` (scripts/run_local.py), SIGKILL included.

    python -I scripts/tether.py --parent PID --name NAME [--guard --grace S] [--hold-fd FD] -- PROGRAM ARG...

It sets the kernel's parent-death signal (prctl PR_SET_PDEATHSIG) in itself, then looks again at its parent: when
that is no longer PID, the parent died before the signal was armed (the kernel would never send it), and nothing is
started. Then either:

- plain: PROGRAM is exec'ed in this very process, with SIGKILL as its parent-death signal (execve keeps it). For
  programs that start no process of their own: nothing of theirs is left behind, and nothing stays in between.
- --guard: this process stays between `make run` and PROGRAM, as a child subreaper (PR_SET_CHILD_SUBREAPER: whatever
  PROGRAM's descendants orphan, a TF process in a session of its own under an agent included, becomes this process's
  child, not init's). Its parent-death signal is SIGTERM; on it, or on SIGTERM/SIGINT/SIGHUP from `make run`
  stopping, it sends SIGTERM to its process group (PROGRAM's graceful stop: an agent kills its tasks and reports
  them), and after --grace seconds SIGKILLs every descendant still there (TensorFlow ignores SIGTERM while it trains:
  /work/shared/TF_NOTES.md). When PROGRAM exits by itself, whatever it left goes too (SIGKILL), and this process exits
  as PROGRAM did (its code, or killed by the same signal). PROGRAM's own parent-death signal is SIGKILL, so a guard
  killed outright does not leave it behind either.

Why a process of its own and not `preexec_fn`: subprocess documents preexec_fn as unsafe when the parent has threads;
here the prctl runs in a fresh single-threaded interpreter, before exec or fork. The standard library alone, but for
psutil when a guard ends (the tree walk): it may run as the embedded PostgreSQL's user.

`--hold-fd`: a descriptor (the var/ lock of scripts/var_lock.py) a guard keeps open, and does not pass on, for its
whole life: the folder stays locked until the last guard of a killed `make run` has taken its processes along.

The kernel sends the parent-death signal when the *thread* that forked this process ends: start it from a thread
that lives as long as its parent (run_local.py: the main thread; bench/stack.py: a spawner thread of its own).

Linux only (prctl); elsewhere PROGRAM is exec'ed with no such guarantee.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterable, Sequence

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
WATCHED = STOP_SIGNALS | {signal.SIGCHLD}
# Python ignores these at start-up; an ignored signal stays ignored across execve (subprocess's restore_signals).
IGNORED_BY_PYTHON = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name))
IDLE_WAKE_S = 30.0  # a guard wakes on SIGCHLD and stop signals; this only bounds a wait on a signal merged away
KILL_DEADLINE_S = 10.0  # descendants this guard may not kill (another user's, when not root) are given up on after it
EXIT_PARENT_GONE = 70


def say(name: str, text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"[tether {name}] {text}\n".encode(errors="replace"))


def prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {value}): {os.strerror(err)}")


def bind_to_parent(parent: int, sig: int) -> bool:
    """Be sent `sig` when `parent` dies; False when it is already gone (the kernel would then never send it: the
    parent died between our fork and the prctl, and we were re-parented)."""
    prctl(PR_SET_PDEATHSIG, sig)
    return os.getppid() == parent


def exec_program(argv: Sequence[str]) -> None:
    for sig in IGNORED_BY_PYTHON:
        signal.signal(sig, signal.SIG_DFL)
    os.execvp(argv[0], list(argv))  # noqa: S606 - an argv, no shell: what make run starts


def spawn(name: str, argv: Sequence[str], mask: Iterable[int]) -> int:
    """PROGRAM in a child of this (single-threaded) process, dying by SIGKILL with it, its signal mask restored."""
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            if bind_to_parent(me, signal.SIGKILL):
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                exec_program(argv)
        except BaseException as exc:  # the forked child must never return into the guard's code
            say(name, f"cannot start {argv[0]}: {exc}")
        os._exit(127)
    return pid


def wipe_environment() -> None:
    """Blank the environment block /proc/<pid>/environ shows: a guard needs none of it once PROGRAM started, and an
    agent's guard would otherwise keep the agent's token there for as long as it runs (the agent blanks its own:
    worker_agent/cli.take_from_environment). PROGRAM got its environment from os.environ, a copy."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        environ = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
        index = 0
        while environ[index]:
            address = environ[index]
            ctypes.memset(address, 0, len(ctypes.string_at(address)))
            index += 1


def reap(child: int, status: int | None) -> int | None:
    """Collect every child that ended (PROGRAM, or an orphan it left that became ours); PROGRAM's wait status once it
    ended."""
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status if status is not None else 127 << 8  # nothing left to wait for
        if pid == 0:
            return status
        if pid == child:
            status = code


def kill_descendants(name: str, child: int, status: int | None) -> int | None:
    """SIGKILL every process below this one until none is left (orphans of the killed become ours, and are killed in
    the next round), reaping them; PROGRAM's wait status once it was reaped."""
    try:
        import psutil
    except ImportError as exc:  # a user that cannot read the venv: its own group at least, this guard included
        say(name, f"cannot walk the process tree ({exc}): SIGKILL to the group")
        os.killpg(0, signal.SIGKILL)
        raise
    me = psutil.Process()
    deadline = time.monotonic() + KILL_DEADLINE_S
    while True:
        left = []
        for process in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if process.status() != psutil.STATUS_ZOMBIE:
                    left.append(process)
                    process.kill()
        status = reap(child, status)
        if not left:
            return status
        if time.monotonic() > deadline:
            say(name, f"could not end pid(s) {', '.join(str(p.pid) for p in left)}")
            return status
        signal.sigtimedwait({signal.SIGCHLD}, 0.1)


def exit_as(status: int) -> None:
    """End this process as PROGRAM ended: `make run` reports a guard's exit as its program's."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        sys.stderr.flush()
        if sig != signal.SIGKILL:  # (whose handling cannot be changed, nor needs to be)
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def guard(name: str, argv: Sequence[str], parent: int, grace_s: float) -> None:
    # Signals are taken synchronously (sigtimedwait), so none interrupts the bookkeeping below halfway.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    if not bind_to_parent(parent, signal.SIGTERM):
        say(name, f"make run (pid {parent}) is gone: not starting")
        os._exit(EXIT_PARENT_GONE)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # the SIGTERM below goes to this group: it must be ours, not make run's
    child = spawn(name, argv, mask)
    wipe_environment()
    status: int | None = None
    stop_at: float | None = None
    while (status := reap(child, status)) is None:
        wait_s = IDLE_WAKE_S
        if stop_at is not None:
            wait_s = stop_at + grace_s - time.monotonic()
            if wait_s <= 0:
                say(name, f"still running {grace_s:g} s after SIGTERM: SIGKILL")
                break
        info = signal.sigtimedwait(WATCHED, wait_s)
        if info is not None and info.si_signo in STOP_SIGNALS and stop_at is None:
            stop_at = time.monotonic()
            why = "stopping" if os.getppid() == parent else f"make run (pid {parent}) is gone"
            say(name, f"{why}: SIGTERM to pid {child}'s group, SIGKILL to what is left after {grace_s:g} s")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(0, signal.SIGTERM)  # this guard's own copy stays pending, and is ignored above
    status = kill_descendants(name, child, status)
    exit_as(status if status is not None else signal.SIGKILL)  # (a wait status: killed by SIGKILL)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parent", type=int, required=True, help="the pid whose death ends PROGRAM")
    parser.add_argument("--name", default="child", help="what the lines written to stderr call PROGRAM")
    parser.add_argument("--guard", action="store_true", help="stay as PROGRAM's parent and take its descendants along")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL (--guard)")
    parser.add_argument("--hold-fd", type=int, help="a descriptor a guard keeps open for its life, not passed on")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM ARG...")
    args = parser.parse_args(argv)
    if args.program[:1] == ["--"]:
        args.program = args.program[1:]
    if not args.program:
        parser.error("no PROGRAM given after --")
    if not 0 <= args.grace <= 3600:
        parser.error("--grace must be between 0 and 3600 seconds")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.hold_fd is not None:
        os.set_inheritable(args.hold_fd, False)
        if not args.guard:
            os.close(args.hold_fd)  # only a guard outlives its start
    if sys.platform == "linux" and args.guard:
        guard(args.name, args.program, args.parent, args.grace)
    if sys.platform == "linux" and not bind_to_parent(args.parent, signal.SIGKILL):
        say(args.name, f"make run (pid {args.parent}) is gone: not starting")
        os._exit(EXIT_PARENT_GONE)
    try:
        exec_program(args.program)
    except OSError as exc:
        say(args.name, f"cannot start {args.program[0]}: {exc}")
        os._exit(127)


if __name__ == "__main__":
    main()
