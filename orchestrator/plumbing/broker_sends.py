"""Celery messages the control plane sends (orders to agents, its own scheduler passes, launches): one `send` for all
of them, and one definition of what a failed send looks like.

A pooled broker connection that Kombu left with a closed channel fails as a broker error here, not AttributeError
(celery_steps/sending.py says when Kombu does that), and the process's pools are dropped so the next send connects
afresh: every caller already handles a broker error (the rows are committed; the heartbeat's convergence or the
watchdog sends again).
"""

from __future__ import annotations

from typing import Any

import kombu.exceptions
import redis

from celery_steps import sending
from orchestrator.plumbing.celery_app import app

# The broker away or refusing: the caller logs it and the message is sent again later (it must never fail a commit).
BROKER_ERRORS = (kombu.exceptions.OperationalError, redis.RedisError, OSError)


def send(name: str, args: list[Any], queue: str, producer: Any = None, countdown: float = 0.0) -> None:
    """`app.send_task` on `queue` (run `countdown` seconds from now, when given); raises one of BROKER_ERRORS when the
    broker did not take it."""
    later = {"countdown": countdown} if countdown > 0 else {}
    sending.send_task(app, name, args=args, queue=queue, producer=producer, **later)
