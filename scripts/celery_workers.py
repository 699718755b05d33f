"""The command line of a control-plane Celery worker, as the product runs it: one definition for `make run`
(scripts/local_stack.py) and the tests that start real workers.

Threads, not processes (the orchestrator's stream readers and the scheduler's lease live in the worker's own
process), and no gossip, mingle or worker heartbeats (config/settings_redis.py says why: broadcast traffic every
worker would answer, and nothing here reads it).
"""

from __future__ import annotations

import sys
from pathlib import Path


def worker_argv(
    queues: str, threads: int, hostname: str, *, beat_schedule: Path | None = None, python: str = sys.executable
) -> list[str]:
    """`queues`: "orchestrator", "scheduler,webhooks", ...; `beat_schedule`: run beat in this worker too, keeping its
    schedule in that file."""
    argv = [python, "-m", "celery", "-A", "config", "worker", "-Q", queues, "--pool", "threads",
            "-c", str(threads), "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-l", "INFO", "--hostname", hostname]  # fmt: skip
    if beat_schedule is not None:
        argv += ["-B", "-s", str(beat_schedule)]
    return argv
