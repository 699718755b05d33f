"""Hello and heartbeat: drop what is stale, record the host's facts and liveness, converge on its tasks."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.utils import timezone

from contracts.host_reports import HostFacts, TaskReport, parse_facts, parse_task_report
from contracts.protocol import AGENT_HEARTBEAT, AGENT_HELLO
from orchestrator.agents import reconcile
from orchestrator.environments import orders as environment_orders
from orchestrator.identity.auth import MALFORMED, REFUSED, STALE, authenticate, remember
from orchestrator.models import Host, HostStatus
from orchestrator.plumbing import counters
from orchestrator.plumbing import pass_requests as passes

log = logging.getLogger(__name__)

# Per host: how long its newest report waited between the agent's send and this side reading it.
REPORT_LAG = "orchestrator_report_lag_s"
# Reports whose facts were older than the stored ones (Host.facts_at) and so not stored.
FACTS_OUTDATED = "host_facts_outdated"


def handle_report(payload: Any, *, hello: bool) -> bool:
    """Process a hello (as the intake reads it from its host's events stream: orchestrator/agents/intake.py), or one
    heartbeat alone (the heartbeat streams' reader applies them in batches: orchestrator/agents/heartbeats.py);
    returns True when it was accepted. An outage raises before its nonce is remembered, so it is applied again."""
    accepted = authenticate(payload, AGENT_HELLO if hello else AGENT_HEARTBEAT)
    if accepted is None:
        return False
    host, body = accepted.host, accepted.message.body
    lags: dict[str, float] = {}
    facts = check(host, accepted.message.ts, body, lags)
    counters.record_readings(REPORT_LAG, lags)
    if facts is not None:
        if hello:
            log.info("agent on %s started (pid %s, version %s)", host.name, facts.pid, facts.agent_version)
        record(host, facts, hello=hello, sent_at=accepted.message.ts)
        if hello:  # a new or restarted agent learns its cluster's task environments (orchestrator/environments)
            environment_orders.tell_host_after_commit(host)
        report = task_report(host, body)
        if report is not None:
            reconcile.converge(host, report)
    remember(accepted)  # handled (an exception above leaves it to be retried)
    return facts is not None


def check(host: Host, sent_at: float, body: Any, lags: dict[str, float]) -> HostFacts | None:
    """The facts of a report that is fresh and well formed, else None (logged and counted). Its transit time goes
    into `lags` (recorded by the caller as REPORT_LAG: one round trip for a batch)."""
    if not isinstance(body, dict):
        log.warning("agent %s sent a report that is not an object", host.name)
        counters.incr(MALFORMED)
        return None
    timeout_s = settings.TFDASH_HEARTBEAT_TIMEOUT_S
    age = time.time() - sent_at
    # Measured before the stale check: a backlog that makes reports stale is exactly what the watchdog must know.
    lags[host.name] = max(age, 0.0)
    if age > timeout_s:
        # Queued while the orchestrator was down: it says nothing about the host now.
        log.info("dropped a %.0f s old report from %s", age, host.name)
        counters.incr(STALE)
        return None
    try:
        facts = parse_facts(body.get("facts") or {})
    except ValueError as exc:
        log.warning("agent %s sent malformed facts: %s", host.name, exc)
        counters.incr(REFUSED)
        return None
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
    return facts


def record(host: Host, facts: HostFacts, *, hello: bool, sent_at: float) -> None:
    """Store the host's liveness and the facts of its report sealed at `sent_at` (unless a newer report's are stored:
    counted); a host that comes (back) online asks for a scheduler pass."""
    recorded = host.record_heartbeat(facts, hello=hello, sent_at=sent_at)
    if not recorded.facts_stored:
        # A hello that waited in the queue behind the first heartbeats, or a replay: what it says is older news.
        log.info("host %s: facts of a report sealed at %.3f not stored: a newer report's are", host.name, sent_at)
        counters.incr(FACTS_OUTDATED)
    if recorded.came_online:
        log.info("host %s is online", host.name)
        passes.schedule_soon(host.cluster_id)  # a queued job may fit now


def task_report(host: Host, body: dict[str, Any]) -> TaskReport | None:
    """The agent's truth about its tasks (orchestrator/agents/reconcile.py), or None (a malformed one is counted)."""
    try:
        return parse_task_report(body.get("tasks"))
    except ValueError as exc:
        log.warning("agent %s sent a malformed task report: %s", host.name, exc)
        counters.incr(MALFORMED)
        return None
