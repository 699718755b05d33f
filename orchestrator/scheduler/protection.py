"""Whether a running job is protected from preemption now, and until when: what its page and the API say.

The rule is orchestrator/core/preemption.py's (`protected_until`), the one the scheduler's victim choice applies
(orchestrator/scheduler/preemption.py); this reads one job's class and placement for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from math import inf

from django.utils import timezone

from orchestrator.core import preemption
from orchestrator.models import Job, JobState, PriorityClass
from orchestrator.scheduler import queueing


@dataclass(frozen=True)
class Protected:
    until: datetime | None  # None: until it ends (it reached its class's bound on preemptions)
    min_run_s: int


def protected(job: Job) -> Protected | None:
    """The job's protection when it is running, could otherwise be a victim (its class is preemptible, or it
    borrows devices) and is protected now; else None."""
    if job.state not in (JobState.STARTING, JobState.RUNNING) or job.ending:
        return None
    klass = job.priority_class or queueing.default_class()
    if not ((klass is not None and klass.preemptible) or job.borrowing):
        return None
    # No class at all (none defined): the model's defaults, as the scheduler's victim choice uses (class_protections).
    protection = (klass or PriorityClass()).protection
    placed = job.placed_at.timestamp() if job.placed_at else None
    until = preemption.protected_until(placed, protection, shielded=job.preemption_shielded)
    if until == inf:
        return Protected(None, protection.min_run_s)
    if until <= timezone.now().timestamp():
        return None
    return Protected(datetime.fromtimestamp(until, tz=UTC), protection.min_run_s)
