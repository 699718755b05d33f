"""What one task attempt may publish through the agent (contracts/publish_limits.py), and what it has had dropped.

A task runs arbitrary code: a loop writing the same artifact line, or printing as fast as it can, would otherwise have
the agent read, encode and queue all of it for Redis. Each attempt gets token buckets (a burst, then a rate) for its
artifact bytes, its output bytes and its metric-line bytes, and a count of artifacts. What does not fit is dropped
before it costs anything (an artifact's size is read from its fd, the file itself never loaded) and counted; the counts
are running totals per attempt, so a report lost or delivered twice still leaves the right number (the ingest keeps
the highest it saw).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from contracts.publish_limits import (
    ARTIFACT_BURST_BYTES,
    ARTIFACT_BYTES_PER_S,
    ARTIFACT_RATE_WORDS,
    LOG_BURST_BYTES,
    LOG_BYTES_PER_S,
    MAX_ARTIFACTS_PER_TASK,
    METRIC_BURST_BYTES,
    METRIC_BYTES_PER_S,
)

Clock = Callable[[], float]


class TokenBucket:
    """`burst` bytes at once, refilled at `rate` bytes a second. Thread-safe: a task's two output files are read by one
    thread, its metrics pipe by another, but a bucket may be shared."""

    def __init__(self, burst: int, rate: float, clock: Clock = time.monotonic) -> None:
        self.burst = burst
        self.rate = rate
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self, amount: int) -> bool:
        """Take `amount` if it is there now (nothing is taken otherwise: a refused item costs nothing)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
            self._at = now
            if amount > self._tokens:
                return False
            self._tokens -= amount
            return True


class PipeBudget:
    """A task attempt's metrics pipe: its artifacts (count and bytes) and its metric lines (bytes), with what was
    dropped so far. Used by the pipe's one reader thread."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._artifact_bytes = TokenBucket(ARTIFACT_BURST_BYTES, ARTIFACT_BYTES_PER_S, clock)
        self._metric_bytes = TokenBucket(METRIC_BURST_BYTES, METRIC_BYTES_PER_S, clock)
        self.artifacts_sent = 0
        self.dropped: dict[str, int] = {}  # contracts/protocol.py TaskMetricsBatch.dropped: running totals
        self.unreported = False  # a drop the control plane has not been told of yet

    def line(self, size: int) -> bool:
        """Whether a metrics line of `size` bytes may be handled; counted as dropped when not."""
        if self._metric_bytes.take(size):
            return True
        self._count("metric_lines", 1)
        return False

    def artifact(self, size: int) -> str | None:
        """None when an artifact of `size` bytes may be sent (then counted as sent), else why not (counted as
        dropped, with its bytes)."""
        if self.artifacts_sent >= MAX_ARTIFACTS_PER_TASK:
            why = f"this task attempt already sent {MAX_ARTIFACTS_PER_TASK} artifacts, as many as allowed"
        elif not self._artifact_bytes.take(size):
            why = f"over this task's artifact rate ({ARTIFACT_RATE_WORDS})"
        else:
            self.artifacts_sent += 1
            return None
        self._count("artifacts", 1)
        self._count("artifact_bytes", size)
        return why

    def _count(self, kind: str, amount: int) -> None:
        self.dropped[kind] = self.dropped.get(kind, 0) + amount
        self.unreported = True


class OutputBudget:
    """A task attempt's stdout and stderr together: whole lines past the rate are dropped; `admit` says how many went
    since the last line that passed, so the caller can number one "lines dropped: N" line in their place."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._bytes = TokenBucket(LOG_BURST_BYTES, LOG_BYTES_PER_S, clock)
        self.dropped = 0  # lines, in all (contracts/protocol.py TaskLogBatch.dropped)
        self.gap = 0  # lines dropped since the last one let through

    def admit(self, size: int) -> bool:
        if self._bytes.take(size):
            return True
        self.dropped += 1
        self.gap += 1
        return False

    def take_gap(self) -> int:
        gap, self.gap = self.gap, 0
        return gap
