"""Telling agents their cluster's task environments: a signed AGENT_ENVIRONMENTS order (contracts/environments.py)
to every host of the cluster once staff save or delete one, and to a host when its agent says hello (so an agent
that was down, or is new, learns them). The agent keeps the list in its workdir, probes each interpreter and reports
the results on its next heartbeat (worker_agent/environments/).

A lost order costs until the agent's next hello or the next change; a repeated one re-probes nothing (the agent
caches each probe per interpreter file). An agent of protocol 3 has no such order: it is sent none, and placement
puts no job that names an environment on its host (it reports none).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import transaction

from contracts.environments import AGENT_ENVIRONMENTS, environments_body
from contracts.host_reports import HostFacts
from contracts.protocol import agent_queue
from contracts.signing import sign_order
from orchestrator.identity.keys import control_private_key
from orchestrator.models import Host, TaskEnvironment
from orchestrator.models.environments import cluster_environments
from orchestrator.plumbing import broker_sends
from orchestrator.plumbing.broker_sends import BROKER_ERRORS

log = logging.getLogger(__name__)

FIRST_PROTOCOL = 4  # the first agent protocol that has the order


def tell_cluster_after_commit(cluster_id: int) -> None:
    """Every host of the cluster gets the cluster's environments once the current transaction commits."""
    transaction.on_commit(lambda: tell(list(Host.objects.filter(cluster_id=cluster_id))))


def tell_host_after_commit(host: Host) -> None:
    def now() -> None:
        _told[host.pk] = time.monotonic()
        tell([host])

    transaction.on_commit(now)


def tell(hosts: list[Host]) -> None:
    """Send each host its cluster's environments now (a broker that does not take one is logged)."""
    lists: dict[int, dict[str, Any]] = {}
    for host in hosts:
        if (getattr(host, "agent_protocol", None) or FIRST_PROTOCOL) < FIRST_PROTOCOL:
            continue
        if host.cluster_id not in lists:
            lists[host.cluster_id] = environments_body(cluster_environments(host.cluster_id))
        message = sign_order(control_private_key(), host.name, AGENT_ENVIRONMENTS, lists[host.cluster_id])
        try:
            broker_sends.send(AGENT_ENVIRONMENTS, [message], agent_queue(host.name))
        except BROKER_ERRORS as exc:
            log.warning("could not tell %s its environments (its next hello does): %r", host.name, exc)


# Convergence: every heartbeat batch compares what each host reports with what its cluster has registered, and a host
# whose report differs (its order was lost or refused as stale, its agent restarted with an old list) is told again,
# at most every RETELL_S. A host probing an environment for the first time differs too for a few seconds: telling it
# again changes nothing there (the same list; each probe is cached).
RETELL_S = 30.0
REGISTERED_TTL_S = 5.0  # the registered lists are read at most this often per process (heartbeats are a hot path)
_told: dict[int, float] = {}  # host id -> when this process last told it (monotonic)
_registered: dict[int, frozenset[tuple[str, str]]] = {}
_registered_at = float("-inf")


def converge(reports: list[tuple[Host, HostFacts]]) -> list[str]:
    """Tell the hosts whose reported environments are not their cluster's registered ones (see above); returns their
    names."""
    global _registered, _registered_at
    if not reports:
        return []
    now = time.monotonic()
    if now - _registered_at >= REGISTERED_TTL_S:
        rows = TaskEnvironment.objects.values_list("cluster_id", "name", "interpreter")
        grouped: dict[int, set[tuple[str, str]]] = {}
        for cluster_id, name, interpreter in rows:
            grouped.setdefault(cluster_id, set()).add((name, interpreter))
        _registered = {cluster_id: frozenset(pairs) for cluster_id, pairs in grouped.items()}
        _registered_at = now
    behind = []
    for host, facts in reports:
        reported = frozenset((e.name, e.interpreter) for e in facts.environments)
        if reported == _registered.get(host.cluster_id, frozenset()):
            continue
        if (getattr(host, "agent_protocol", None) or FIRST_PROTOCOL) < FIRST_PROTOCOL:
            continue
        if now - _told.get(host.pk, float("-inf")) < RETELL_S:
            continue
        _told[host.pk] = now
        behind.append(host)
    if behind:
        log.info("telling %s their task environments again", ", ".join(h.name for h in behind))
        tell(behind)
    return [h.name for h in behind]
