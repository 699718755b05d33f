"""Sending with a Celery app whose pooled broker connections Kombu may have left broken.

Kombu 5.5.4 can leave a pooled broker connection holding a channel that was closed when Redis went away mid-publish
(its `connection` is None; the same error is reported upstream, e.g. digitalfabrik/opendrift-leeway-webgui#119, and
celery/kombu#83 long ago): every later publish that draws that connection raises AttributeError ("'NoneType' object
has no attribute 'client'") instead of a broker error, and the pool never heals by itself. The chaos soak met it in a
cancel's kill order while Redis restarted (bench/chaos.py). `send_task` turns it into a broker error (Kombu's
OperationalError) and drops the process's broker pools (Kombu's, and the app's connection and producer pools, which
Celery makes again on next use), so the next send connects afresh, as Kombu itself does after a fork.
"""

from __future__ import annotations

import logging
from typing import Any

import kombu.exceptions
import kombu.pools
from celery import Celery

log = logging.getLogger(__name__)

BROKEN_CHANNEL = "'NoneType' object has no attribute"


def send_task(app: Celery, name: str, **options: Any) -> None:
    """`app.send_task(name, **options)`; a pooled connection with a closed channel raises
    kombu.exceptions.OperationalError instead of AttributeError, after the pools were dropped."""
    try:
        app.send_task(name, **options)
    except AttributeError as exc:
        if BROKEN_CHANNEL not in str(exc):
            raise
        drop_pools(app)
        raise kombu.exceptions.OperationalError(f"a pooled broker connection had a closed channel: {exc}") from exc


def drop_pools(app: Celery) -> None:
    """Forget every pooled broker connection and producer of this process: the next send opens new ones."""
    log.warning("broker connection pools dropped (a pooled connection had a closed channel)")
    kombu.pools.reset()
    app._pool = None  # Celery makes a new connection pool on next use
    app.amqp._producer_pool = None
