"""Outages worth waiting out: the database or the broker away or busy (a lock wait past its timeout is an
OperationalError too). Anything else is a bug or bad input, and retrying would fail the same way. One definition for
the Celery entry points' retries (orchestrator/tasks.py) and for handlers that isolate one item's failure from the
rest of a batch (orchestrator/agents/events.py)."""

from __future__ import annotations

import kombu.exceptions
import redis
from django.db import InterfaceError, OperationalError

TRANSIENT = (
    OperationalError,
    InterfaceError,
    redis.ConnectionError,
    redis.TimeoutError,
    kombu.exceptions.OperationalError,
)
