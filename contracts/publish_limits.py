"""What one task may publish through its agent, what one read of the hosts' streams may take, and how much memory the
Redis the project starts may hold: the bounds that keep one task (or one host) from filling Redis or the ingest.

A task runs arbitrary code; before these bounds a loop writing the same artifact line sent an ~85 MiB stream entry per
iteration, which Redis kept (append-only) and the ingest loaded, until one of them ran out of memory. Now:
- the agent (worker_agent/supervision/publish_budget.py) lets each task attempt publish at most
  MAX_ARTIFACTS_PER_TASK artifacts and, as token buckets, ARTIFACT_BURST_BYTES at once then ARTIFACT_BYTES_PER_S,
  LOG_BURST_BYTES of output then LOG_BYTES_PER_S, and METRIC_BURST_BYTES of metric lines then METRIC_BYTES_PER_S.
  What is over is dropped before it is read (an artifact's size is taken from its fd, the file is never loaded) and
  counted per task attempt; the counts ride in the task's reports (contracts/metric_messages.py
  TaskMetricsBatch.dropped, contracts/task_messages.py TaskLogBatch.dropped) and its log gets a "lines dropped: N"
  line where lines went missing, so the job page and API say what was dropped;
- one read of the hosts' streams (orchestrator/plumbing/streams.py) stops taking entries once READ_BYTES_BUDGET is
reached
  (one entry within its kind's bound always goes, so a lone artifact is never stuck);
- the Redis that `make run`, compose and the suite start refuses writes past REDIS_MAXMEMORY_BYTES and evicts nothing
  (`noeviction`: every key it holds is work not yet stored); an agent whose XADD is refused keeps the message in its
  outbox and retries, and the readers still drain (reading, acknowledging and deleting are allowed when full).
The bounds of one task add up to the most one host's streams hold from it: ARTIFACT_BURST_BYTES (as base64, 4/3 of it)
plus about a second of each rate, far below REDIS_MAXMEMORY_BYTES; the entry-count caps (contracts/protocol.py
STREAM_MAXLEN) stay for a reader stopped for hours.
"""

from __future__ import annotations

from contracts.limits import MAX_ARTIFACT_BYTES

_MIB = 1024 * 1024

# Artifacts one task attempt may publish (a model saved each epoch under one name included); more are dropped.
MAX_ARTIFACTS_PER_TASK = 64
# Artifact bytes: two of the largest at once (the final model and a TensorBoard archive as a task ends), then a
# sustained 1 MiB/s (a 64 MiB model once a minute). Checked against the file's size before it is read.
ARTIFACT_BURST_BYTES = 2 * MAX_ARTIFACT_BYTES
ARTIFACT_BYTES_PER_S = 1 * _MIB
# The artifact rate in words, as the agent's refusal and the job page say it.
ARTIFACT_RATE_WORDS = f"{ARTIFACT_BURST_BYTES // _MIB} MiB at once, then {ARTIFACT_BYTES_PER_S // _MIB} MiB/s"
# A task's stdout and stderr together: TensorFlow's start-up chatter is a few hundred KB; a training loop printing a
# line per step is a few KB/s. Past the rate, whole lines are dropped and one "lines dropped: N" line takes their place.
LOG_BURST_BYTES = 8 * _MIB
LOG_BYTES_PER_S = 1 * _MIB
# The metrics pipe (JSON lines of points and facts): a report every 0.5 s is well under a KB.
METRIC_BURST_BYTES = 4 * _MIB
METRIC_BYTES_PER_S = 256 * 1024

# What one read of the hosts' streams hands to its reader at most (plus one entry: an entry alone always goes).
READ_BYTES_BUDGET = 16 * _MIB

# The Redis the project starts (make run, compose, the suite): past this it refuses writes, evicting nothing.
REDIS_MAXMEMORY_BYTES = 1024 * _MIB
REDIS_MAXMEMORY_POLICY = "noeviction"


def lines_dropped_text(count: int) -> str:
    """The log line that stands where a task's output was dropped for its rate (the agent numbers it like any)."""
    return (
        f"… lines dropped: {count:,} (this task wrote more than {LOG_BYTES_PER_S // 1024:,} KiB/s of output after a "
        f"burst of {LOG_BURST_BYTES // _MIB} MiB)"
    )
