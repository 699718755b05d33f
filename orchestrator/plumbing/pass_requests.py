"""Asking for a scheduler pass: by Celery task name, so domain code never imports the Celery entry points
(orchestrator/tasks.py imports the domain, not the other way round)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from functools import lru_cache

import redis
from django.conf import settings

from contracts.protocol import SCHEDULER_QUEUE
from orchestrator.plumbing import after_commit, broker_sends
from orchestrator.plumbing.broker_sends import BROKER_ERRORS

SCHEDULE = "orchestrator.schedule"
# A pass asked for and not yet begun (one key per cluster): further asks are covered by it and send nothing, so a
# burst of 1,000 submissions costs a few passes, not 1,000 (each of which would read the whole queue). The pass
# deletes the key before it reads anything, so an ask that arrives after that sends a new pass and nothing is missed;
# the expiry bounds the harm of a pass message lost with its key still set (the watchdog asks again every tick).
PENDING_KEY = "tfdash:schedule-pending:{}"
PENDING_TTL_S = 10
# When the cluster's last pass began (epoch seconds): the next one is sent to begin TFDASH_SCHEDULE_INTERVAL_S after
# it. Passes cost about the same whatever they place (the queue and the fleet are read whole), so gangs that end
# within an interval are placed by one pass, not one each.
BEGAN_KEY = "tfdash:schedule-began:{}"
# The broker away: what asks for a pass or sends an order after a commit must not fail for it (the rows are
# committed; a web request would answer 500 for a job it stored). The watchdog's passes and the heartbeat's
# convergence make good what could not be sent.

log = logging.getLogger(__name__)


def schedule_soon(cluster_id: int) -> None:
    """Ask for a pass over the cluster's queue (a host came back, capacity may have freed): now, or when the interval
    since the last pass began is over."""
    try:
        client = _pending()
        interval = settings.TFDASH_SCHEDULE_INTERVAL_S
        if not client.set(PENDING_KEY.format(cluster_id), b"1", nx=True, ex=PENDING_TTL_S + math.ceil(interval)):
            return  # a pass that has not begun yet will see what this caller wrote
        try:
            broker_sends.send(SCHEDULE, [cluster_id], SCHEDULER_QUEUE, countdown=_wait(client, cluster_id))
        except BROKER_ERRORS:
            _pending().delete(PENDING_KEY.format(cluster_id))  # no pass is coming: the next ask must send one
            raise
    except BROKER_ERRORS as exc:
        log.warning("could not ask for a scheduler pass over cluster %s (the watchdog's next one will do): %r",
                    cluster_id, exc)  # fmt: skip


def pass_begins(cluster_id: int) -> None:
    """Called by a pass before it reads the queue: asks from now on need a pass of their own, one interval on."""
    try:
        with _pending().pipeline() as pipe:
            pipe.delete(PENDING_KEY.format(cluster_id))
            pipe.set(
                BEGAN_KEY.format(cluster_id), repr(time.time()), ex=math.ceil(settings.TFDASH_SCHEDULE_INTERVAL_S) + 1
            )
            pipe.execute()
    except redis.RedisError as exc:  # the key expires by itself
        log.warning("could not clear the pending-pass mark of cluster %s: %r", cluster_id, exc)


def _wait(client: redis.Redis, cluster_id: int) -> float:
    """Seconds until the cluster's next pass may begin (0: now). Bounded by the interval whatever the clocks of the
    workers that wrote and read the mark say."""
    interval = settings.TFDASH_SCHEDULE_INTERVAL_S
    began = client.get(BEGAN_KEY.format(cluster_id))
    try:
        since = time.time() - float(began) if began is not None else interval
    except ValueError:
        since = interval
    return min(interval, max(0.0, interval - since))


@lru_cache(maxsize=1)
def _pending() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)


@dataclass(frozen=True)
class _Ask:
    """An after-commit ask for a pass over one cluster, equal to any other for the same cluster."""

    cluster_id: int

    def __call__(self) -> None:
        schedule_soon(self.cluster_id)


def schedule_after_commit(cluster_id: int) -> None:
    """Ask for a pass once the current transaction commits: the pass must see the rows this one wrote. One ask per
    cluster and transaction (1,000 jobs submitted together ask once, not 1,000 times): an ask already queued in this
    transaction is sent after the same commit (plumbing/after_commit.py)."""
    after_commit.once(_Ask(cluster_id))
