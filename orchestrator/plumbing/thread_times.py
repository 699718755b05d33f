"""Where a thread's time went over a stretch of work: on a core, waiting for one, or neither (blocked: a query, the
network). The scheduler's log says so of every pass that placed: on a machine whose cores are full, a pass takes
several times its CPU, and whether that is the cores or PostgreSQL decides what to add (README, Sizing)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

# Linux: this thread's time on a core and waiting on a run queue, in ns (the first two fields; CONFIG_SCHED_INFO).
_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def _waited_ns() -> int | None:
    try:
        return int(_SCHEDSTAT.read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None  # not Linux, or a kernel without it: the log leaves it out


@dataclass(frozen=True)
class Spent:
    wall: float
    cpu: float  # this thread's CPU
    waiting: float | None  # runnable but not running: the cores were busy with others (None: the kernel does not say)

    def __str__(self) -> str:
        waited = "" if self.waiting is None else f", {self.waiting:.4f} s waiting for a core"
        return f"{self.wall:.4f} s ({self.cpu:.4f} s of CPU{waited})"


class Stopwatch:
    """Started on the thread it measures; `spent()` on the same thread."""

    def __init__(self) -> None:
        self._wall, self._cpu, self._waited = time.perf_counter(), time.thread_time(), _waited_ns()

    def spent(self) -> Spent:
        waited = _waited_ns()
        return Spent(
            time.perf_counter() - self._wall,
            time.thread_time() - self._cpu,
            None if waited is None or self._waited is None else (waited - self._waited) / 1e9,
        )
