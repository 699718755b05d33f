"""Fair share's memory, written as tasks end: the task's decayed device-seconds added to its owner's row on its
cluster (orchestrator/models/queueing.py DecayedUsage; the arithmetic is orchestrator/core/fair_share.py). Called in
the transaction that ends the task (lifecycle.finish_task), so a replayed end event, which ends nothing, adds nothing.
"""

from __future__ import annotations

from datetime import datetime

from orchestrator.core import fair_share
from orchestrator.models import DecayedUsage, Task


def held_since(task: Task) -> datetime | None:
    """When the task's devices were taken: its job's placement for the gang's first run of it; a task started again
    in place (a ParameterServer worker's relaunch) from its own start."""
    if task.restart == 0 and task.attempt == task.job.attempt and task.job.placed_at is not None:
        return task.job.placed_at
    return task.started_at


def add_ended(task: Task, ended: datetime) -> None:
    since = held_since(task)
    devices = len(task.devices or [])
    if since is None or devices == 0:
        return
    job = task.job
    half_life = job.cluster.fair_share_half_life_s
    more = fair_share.accrued(devices, since.timestamp(), ended.timestamp(), half_life)
    DecayedUsage.objects.get_or_create(cluster_id=job.cluster_id, user_id=job.owner_id)
    row = DecayedUsage.objects.select_for_update().get(cluster_id=job.cluster_id, user_id=job.owner_id)
    row.value, row.as_of = fair_share.added(row.value, row.as_of, more, ended.timestamp(), half_life)
    row.save(update_fields=["value", "as_of"])
