"""Hello and heartbeat: drop what is stale, record the host's facts and liveness, converge on its tasks."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.utils import timezone

from contracts.protocol import AGENT_HEARTBEAT, AGENT_HELLO, parse_facts, parse_task_report
from orchestrator import counters
from orchestrator.agents import reconcile
from orchestrator.agents.auth import MALFORMED, REFUSED, STALE, authenticate, remember
from orchestrator.control import passes
from orchestrator.models import Host, HostStatus

log = logging.getLogger(__name__)

# Per host: how long its newest report waited between the agent's send and this side reading it.
REPORT_LAG = "orchestrator_report_lag_s"


def handle_report(payload: Any, *, hello: bool) -> bool:
    """Process a hello or heartbeat; returns True when it was accepted."""
    accepted = authenticate(payload, AGENT_HELLO if hello else AGENT_HEARTBEAT)
    if accepted is None:
        return False
    applied = _apply(accepted.host, accepted.message.ts, accepted.message.body, hello=hello)
    remember(accepted)  # handled (an exception above leaves it to be retried)
    return applied


def _apply(host: Host, sent_at: float, body: Any, *, hello: bool) -> bool:
    if not isinstance(body, dict):
        log.warning("agent %s sent a report that is not an object", host.name)
        counters.incr(MALFORMED)
        return False
    timeout_s = settings.TFDASH_HEARTBEAT_TIMEOUT_S
    age = time.time() - sent_at
    # Measured before the stale check: a backlog that makes reports stale is exactly what the watchdog must know.
    counters.record_reading(REPORT_LAG, host.name, max(age, 0.0))
    if age > timeout_s:
        # Queued while the orchestrator was down: it says nothing about the host now.
        log.info("dropped a %.0f s old report from %s", age, host.name)
        counters.incr(STALE)
        return False
    try:
        facts = parse_facts(body.get("facts") or {})
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
    if host.record_heartbeat(facts, hello=hello):
        log.info("host %s is online", host.name)
        passes.schedule_soon(host.cluster_id)  # a queued job may fit now
    _converge(host, body)
    return True


def _converge(host: Host, body: dict[str, Any]) -> None:
    """What the agent says about its tasks against what this side believes (orchestrator/agents/reconcile.py)."""
    try:
        report = parse_task_report(body.get("tasks"))
    except ValueError as exc:
        log.warning("agent %s sent a malformed task report: %s", host.name, exc)
        counters.incr(MALFORMED)
        return
    if report is not None:
        reconcile.converge(host, report)
