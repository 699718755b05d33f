"""Asking for a scheduler pass: by Celery task name, so domain code never imports the Celery entry points
(orchestrator/tasks.py imports the domain, not the other way round)."""

from __future__ import annotations

import logging

import kombu.exceptions
import redis
from django.db import transaction

from config.celery import app
from contracts.protocol import ORCHESTRATOR_QUEUE

SCHEDULE = "orchestrator.schedule"
# The broker away: what asks for a pass or sends an order after a commit must not fail for it (the rows are
# committed; a web request would answer 500 for a job it stored). The watchdog's passes and the heartbeat's
# convergence make good what could not be sent.
BROKER_ERRORS = (kombu.exceptions.OperationalError, redis.RedisError, OSError)

log = logging.getLogger(__name__)


def schedule_soon(cluster_id: int) -> None:
    """Ask for a pass over the cluster's queue now (a host came back, capacity may have freed)."""
    try:
        app.send_task(SCHEDULE, args=[cluster_id], queue=ORCHESTRATOR_QUEUE)
    except BROKER_ERRORS as exc:
        log.warning("could not ask for a scheduler pass over cluster %s (the watchdog's next one will do): %r",
                    cluster_id, exc)  # fmt: skip


def schedule_after_commit(cluster_id: int) -> None:
    """Ask for a pass once the current transaction commits: the pass must see the rows this one wrote."""
    transaction.on_commit(lambda: schedule_soon(cluster_id))
