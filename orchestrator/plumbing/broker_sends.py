"""Celery messages the control plane sends (orders to agents, its own scheduler passes, launches and relayed events):
one `send` for all of them, and one definition of what a failed send looks like.

Kombu 5.5.4 can leave a pooled broker connection holding a channel that was closed when Redis went away mid-publish
(its `connection` is None; the same error is reported upstream, e.g. digitalfabrik/opendrift-leeway-webgui#119, and
celery/kombu#83 long ago): every later publish that draws that connection raises AttributeError ("'NoneType' object
has no attribute 'client'") instead of a broker error, and the pool never heals by itself. The chaos soak met it in a
cancel's kill order while Redis restarted (bench/chaos.py). `send` turns it into a broker error, which every caller
already handles (the rows are committed; the heartbeat's convergence or the watchdog sends again), and drops the
process's broker pools so the next send connects afresh, as Kombu itself does after a fork.
"""

from __future__ import annotations

import logging
from typing import Any

import kombu.exceptions
import kombu.pools
import redis

from orchestrator.plumbing.celery_app import app

log = logging.getLogger(__name__)

# The broker away or refusing: the caller logs it and the message is sent again later (it must never fail a commit).
BROKER_ERRORS = (kombu.exceptions.OperationalError, redis.RedisError, OSError)

_BROKEN_CHANNEL = "'NoneType' object has no attribute"


def send(name: str, args: list[Any], queue: str, producer: Any = None, countdown: float = 0.0) -> None:
    """`app.send_task` on `queue` (run `countdown` seconds from now, when given); raises one of BROKER_ERRORS when the
    broker did not take it."""
    later = {"countdown": countdown} if countdown > 0 else {}
    try:
        app.send_task(name, args=args, queue=queue, producer=producer, **later)
    except AttributeError as exc:
        if _BROKEN_CHANNEL not in str(exc):
            raise
        drop_pools()
        raise kombu.exceptions.OperationalError(f"a pooled broker connection had a closed channel: {exc}") from exc


def drop_pools() -> None:
    """Forget every pooled broker connection and producer of this process: the next send opens new ones."""
    log.warning("broker connection pools dropped (a pooled connection had a closed channel)")
    kombu.pools.reset()
    app._pool = None  # Celery makes a new connection pool on next use
    app.amqp._producer_pool = None
