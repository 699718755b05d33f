"""Which job states are final: the one definition (`orchestrator.models.JobState` names every state and checks these
against its own; the experiment verdict, the queue, the quotas and the pages read them from there or here).

A final job holds nothing (no devices, no quota, no task uids) and never changes state again; `preempted` and
`restarting` are not final: the job goes back to the queue.
"""

from __future__ import annotations

SUCCEEDED = "succeeded"
TERMINAL_JOB_STATES: tuple[str, ...] = (SUCCEEDED, "failed", "cancelled", "timed_out")
