"""Who sent an agent message: every message names its host and carries that host's token; anything else is refused,
logged and counted, with the same answer for an unknown host and a wrong token."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from orchestrator import counters
from orchestrator.models import Host

log = logging.getLogger(__name__)
T = TypeVar("T")

REFUSED = "agent_messages_refused"
STALE = "agent_messages_stale"
MALFORMED = "agent_messages_malformed"


def host_with_token(name: str, token: str) -> Host | None:
    """The host called `name` if `token` is its token, else None."""
    host = Host.objects.filter(name=name).first()
    return host if host is not None and host.check_token(token) else None


def authenticate(payload: Any, lookup: Callable[[str, str], Host | None] = host_with_token) -> Host | None:
    """The host a message comes from, or None (logged and counted) when it cannot be trusted; `lookup(name, token)`
    finds the host whose token it is (the ingest passes one with a short-lived cache)."""
    if not isinstance(payload, dict):
        log.warning("agent message refused: payload is %s, not an object", type(payload).__name__)
        counters.incr(REFUSED)
        return None
    name, token = payload.get("host"), payload.get("token")
    if not isinstance(name, str) or not isinstance(token, str):
        log.warning("agent message refused: host or token missing")
        counters.incr(REFUSED)
        return None
    host = lookup(name, token)
    # Same message for an unknown host and a wrong token: a probe learns nothing about which names exist.
    if host is None:
        log.warning("agent message refused: bad credentials for host %r", name[:100])
        counters.incr(REFUSED)
        return None
    return host


def authenticated_body(
    payload: Any, body_type: type[T], lookup: Callable[[str, str], Host | None] = host_with_token
) -> tuple[Host, T] | None:
    """The sending host and the message body as `body_type`, or None (logged and counted) when either fails."""
    host = authenticate(payload, lookup)
    if host is None:
        return None
    try:
        return host, body_type(**payload["body"])
    except (KeyError, TypeError) as exc:
        log.warning("malformed %s from %s: %r", body_type.__name__, host.name, exc)
        counters.incr(MALFORMED)
        return None
