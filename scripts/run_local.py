#!/usr/bin/env python
"""`make run`: the whole product on this machine, one command, Ctrl-C stops it all.

Starts (or reuses) PostgreSQL and Redis (scripts/local_services.py), migrates, makes sure an admin exists, registers
a local cluster of agents, then starts the web server, the orchestrator (Celery worker + beat), the metrics ingest and
one agent per local host, each in a session of its own. Their output goes to var/log/<name>.log; this script prints
only what a person needs.

None of them outlives this script, SIGKILL included: each is started through scripts/tether.py (the kernel's
parent-death signal; a guard that stays to take along what a process with children of its own leaves, an agent's TF
processes included). And one var/ folder has one `make run` at a time: a second one refuses at once, naming the pid
that holds it (scripts/var_lock.py). `--exit-with-parent` (what `make run` passes) stops it when its parent (make)
dies.

A child that exits is started again after a pause (`Backoff`: 1 s, doubling to 30 s while it keeps failing, 1 s again
once it ran a minute), and the line says so; one crash never stops the rest. Ctrl-C or SIGTERM stops everything.

This file is the entry point (`make run` runs it); what it starts, in order, is scripts/local_stack.py, and how each
child is started, restarted and stopped is scripts/local_children.py.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(1, str(ROOT))

import tether  # noqa: E402 - after the path
from local_stack import Stack  # noqa: E402 - after the path


def exit_with_parent() -> None:
    """Stop (SIGTERM: the same orderly stop as Ctrl-C) when the parent dies, `make` SIGKILLed included: `make run`
    passes --exit-with-parent. Not by default: a run started from a shell that then exits (nohup) keeps running.

    The parent is whichever this process has when it gets here (make may be PID 1, in a container): one that died
    during this interpreter's start-up, before that, goes unnoticed, and the run goes on as it did before this."""
    parent = os.getppid()
    if sys.platform == "linux" and not tether.bind_to_parent(parent, signal.SIGTERM):
        raise SystemExit("the process that started this one is gone: not starting")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--exit-with-parent"]):
        print(f"usage: {sys.argv[0]} [--exit-with-parent]", file=sys.stderr)
        return 2

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        if args:
            exit_with_parent()
        stack = Stack()
    except SystemExit as exc:  # nothing started yet: a var/ in use, or a parent already gone
        print(f"[run] {exc.code}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:  # stopped before anything started
        return 1
    code = 0
    try:
        stack.run()
    except KeyboardInterrupt:
        stack.say("Stopping ...")
    except SystemExit as exc:
        stack.say(str(exc.code))
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stack.stop_all()
        stack.say("stopped.")
    return code


if __name__ == "__main__":
    sys.exit(main())
