"""The watchdog's view of hosts: one that stopped heartbeating is offline, and its tasks are lost."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import redis
from django.conf import settings
from django.utils import timezone

from orchestrator.agents import heartbeats
from orchestrator.agents.reports import REPORT_LAG
from orchestrator.jobs import restarts
from orchestrator.models import Host
from orchestrator.plumbing import counters

log = logging.getLogger(__name__)

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
        # This side stalled (or Redis, which carries both the ticks and the beats, was away): hosts could not be
        # heard either, so it listens for a whole timeout again before calling any of them silent.
        _first_check = now
        log.warning("watchdog ran %.1f s after its previous tick; not judging host liveness for %.0f s",
                    now - previous, timeout_s)  # fmt: skip
        return []
    try:
        waited = heartbeats.unapplied_age_s(counters.client())
    except redis.RedisError as exc:
        _first_check = now
        log.warning("cannot see the heartbeat stream (%r); not judging host liveness for %.0f s", exc, timeout_s)
        return []
    if waited > timeout_s / 2:
        # A heartbeat waits unapplied in its stream (no reader reads, or one is stuck holding a batch): any host's
        # report may be among those waiting, so its silence may be ours.
        log.warning("a heartbeat has waited %.1f s unapplied; not judging host liveness this tick", waited)
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
    for host_id, name in flipped:
        log.warning("host %s is offline: no heartbeat for %.0f s", name, settings.TFDASH_HEARTBEAT_TIMEOUT_S)
        restarts.host_lost(host_id, name)
    return [name for _host_id, name in flipped]
