"""Fair share's memory of an ended task: its decayed device-seconds added to its owner's row on its cluster
(orchestrator/models/queueing.py DecayedUsage; the arithmetic is orchestrator/core/fair_share.py). Called by
`recording.task_ended`, in the transaction that ends the task and once per task, as the daily rollup is."""

from __future__ import annotations

from datetime import datetime

from orchestrator.core import fair_share
from orchestrator.models import DecayedUsage, Job


def add_ended(job: Job, devices: int, start: datetime, end: datetime) -> None:
    half_life = job.cluster.fair_share_half_life_s
    more = fair_share.accrued(devices, start.timestamp(), end.timestamp(), half_life)
    DecayedUsage.objects.get_or_create(cluster_id=job.cluster_id, user_id=job.owner_id)
    row = DecayedUsage.objects.select_for_update().get(cluster_id=job.cluster_id, user_id=job.owner_id)
    row.value, row.as_of = fair_share.added(row.value, row.as_of, more, end.timestamp(), half_life)
    row.save(update_fields=["value", "as_of"])
