"""The orchestrator's side of agent messages: authenticate, drop what is stale, record what is reported."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.utils import timezone

from orchestrator import counters
from orchestrator.models import Host, HostStatus
from worker_agent.protocol import PROTOCOL_VERSION, parse_facts, parse_task_report

log = logging.getLogger(__name__)
T = TypeVar("T")

REFUSED = "agent_messages_refused"
STALE = "agent_messages_stale"
MALFORMED = "agent_messages_malformed"
# Per host: how long its newest report waited between the agent's send and this side reading it.
REPORT_LAG = "orchestrator_report_lag_s"


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


def handle_report(payload: Any, *, hello: bool) -> bool:
    """Process a hello or heartbeat; returns True when it was accepted."""
    host = authenticate(payload)
    if host is None:
        return False
    if payload.get("protocol") != PROTOCOL_VERSION:
        log.warning("agent %s speaks protocol %r, expected %s", host.name, payload.get("protocol"), PROTOCOL_VERSION)
        counters.incr(REFUSED)
        return False
    timeout_s = settings.TFDASH_HEARTBEAT_TIMEOUT_S
    age = time.time() - float(payload.get("sent_at", 0))
    # Measured before the stale check: a backlog that makes reports stale is exactly what the watchdog must know.
    counters.record_reading(REPORT_LAG, host.name, max(age, 0.0))
    if age > timeout_s:
        # Queued while the orchestrator was down: it says nothing about the host now.
        log.info("dropped a %.0f s old report from %s", age, host.name)
        counters.incr(STALE)
        return False
    try:
        facts = parse_facts(payload.get("facts") or {})
    except ValueError as exc:
        log.warning("agent %s sent malformed facts: %s", host.name, exc)
        counters.incr(REFUSED)
        return False
    if facts.port_range and facts.port_range != (host.port_min, host.port_max):
        log.warning(
            "agent %s runs with port range %s-%s but is registered with %s-%s; the registered range is used",
            host.name,
            *facts.port_range,
            host.port_min,
            host.port_max,
        )
    if host.last_heartbeat is not None and host.status == HostStatus.ONLINE:
        gap = (timezone.now() - host.last_heartbeat).total_seconds()
        if gap > timeout_s / 2:  # worth a line: the host came close to being declared lost
            log.warning("host %s: %.1f s since its previous heartbeat (%.2f s in transit)", host.name, gap, age)
    if hello:
        log.info("agent on %s started (pid %s, version %s)", host.name, facts.pid, facts.agent_version)
        _reconcile(host, payload)
    if host.record_heartbeat(facts, hello=hello):
        log.info("host %s is online", host.name)
        from orchestrator.tasks import schedule  # a queued job may fit now

        schedule.delay(host.cluster_id)
    return True


def _reconcile(host: Host, payload: dict[str, Any]) -> None:
    """What the hello says runs on the host against what this side believes runs there (orchestrator/reconcile.py)."""
    try:
        report = parse_task_report(payload.get("tasks"))
    except ValueError as exc:
        log.warning("agent %s sent a malformed task report: %s", host.name, exc)
        counters.incr(MALFORMED)
        return
    if report is None:  # an agent from before reconciling: it cannot say
        return
    from orchestrator import reconcile  # it uses lifecycle, which uses this module

    done = reconcile.reconcile_host(host, report, float(payload["sent_at"]))
    if done.lost or done.killed:
        log.warning("reconciled agent on %s: tasks %s are over, tasks %s killed", host.name, done.lost, done.killed)


_first_check: float | None = None
_last_check: float | None = None


def mark_silent_hosts_offline() -> list[str]:
    """Flip hosts whose heartbeats stopped to offline, unless this side cannot currently tell silence from its own
    delay: a host is only judged while the orchestrator reads reports promptly and its watchdog ticks on time (the
    Kubernetes node controller pauses evictions in the same spirit when the control plane itself is the problem)."""
    global _first_check, _last_check
    timeout_s = settings.TFDASH_HEARTBEAT_TIMEOUT_S
    now = time.monotonic()
    if _first_check is None:
        _first_check = now
    if now - _first_check < timeout_s:
        # A watchdog that has not listened for a whole timeout cannot call anyone silent: after an orchestrator
        # restart every stored heartbeat is old, and the fresh ones are still on their way.
        return []
    previous, _last_check = _last_check, now
    if previous is not None and now - previous > timeout_s / 2:
        log.warning("watchdog ran %.1f s after its previous tick; not judging host liveness this tick", now - previous)
        return []
    # The smallest recent lag over all hosts: when even the promptest host's reports arrive late, the delay is on
    # this side (a backlog, a stall); one host with a skewed clock or a slow link cannot pause the others' checks.
    lags = counters.recent_readings(REPORT_LAG, max_age_s=timeout_s)
    lag = min(lags.values(), default=0.0)
    if lag > timeout_s / 2:
        log.warning("agent reports reach the orchestrator %.1f s late; not judging host liveness this tick", lag)
        return []
    cutoff = timezone.now() - timedelta(seconds=timeout_s)
    flipped = Host.mark_silent_offline(cutoff)
    from orchestrator import lifecycle  # lifecycle uses this module to authenticate

    for host_id, name in flipped:
        log.warning("host %s is offline: no heartbeat for %.0f s", name, settings.TFDASH_HEARTBEAT_TIMEOUT_S)
        lifecycle.host_lost(host_id, name)
    return [name for _host_id, name in flipped]
