"""Asking for a scheduler pass: by Celery task name, so domain code never imports the Celery entry points
(orchestrator/tasks.py imports the domain, not the other way round)."""

from __future__ import annotations

from django.db import transaction

from config.celery import app
from contracts.protocol import ORCHESTRATOR_QUEUE

SCHEDULE = "orchestrator.schedule"


def schedule_soon(cluster_id: int) -> None:
    """Ask for a pass over the cluster's queue now (a host came back, capacity may have freed)."""
    app.send_task(SCHEDULE, args=[cluster_id], queue=ORCHESTRATOR_QUEUE)


def schedule_after_commit(cluster_id: int) -> None:
    """Ask for a pass once the current transaction commits: the pass must see the rows this one wrote."""
    transaction.on_commit(lambda: schedule_soon(cluster_id))
