"""The scheduler's policies, one table: what TFDASH_SCHEDULER_POLICY may name and what each does in a pass
(orchestrator/scheduler/scheduling.py), the same rows bench/queue_replay.py and bench/scale.py replay.

`backfill` (the default): a reservation for each of the first TFDASH_BACKFILL_DEPTH jobs that do not fit, jobs
behind start when they keep clear of them, and a reserved job may preempt. `fifo`: strict first come, first served,
a job that does not fit holds back every job behind it (so its only reservation is its own), no preemption.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_BACKFILL_DEPTH = 8  # TFDASH_BACKFILL_DEPTH's default


@dataclass(frozen=True)
class Policy:
    name: str
    holds_back: bool  # a waiting job that does not fit holds back every job behind it
    preempts: bool  # a reserved job may stop lower-priority gangs (orchestrator/scheduler/preemption.py)
    depth: int | None = None  # how many jobs that do not fit get a reservation per pass; None: TFDASH_BACKFILL_DEPTH

    def reservations(self, backfill_depth: int = DEFAULT_BACKFILL_DEPTH) -> int:
        """The planner's depth under this policy, where the setting says `backfill_depth`."""
        return backfill_depth if self.depth is None else self.depth


POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (
        Policy("backfill", holds_back=False, preempts=True),
        Policy("fifo", holds_back=True, preempts=False, depth=1),
    )
}
DEFAULT_POLICY = "backfill"
