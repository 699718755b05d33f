"""A host's agent joining (contracts/join.py): the configuration it is told, signed for it by the control plane."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.conf import settings
from django.http import HttpRequest

from contracts.join import AGENT_JOIN, JoinConfig
from contracts.signing import sign_order
from orchestrator.identity.broker_users import agent_server_url
from orchestrator.identity.keys import control_private_key, control_public_key
from orchestrator.models import Host


def config_for(host: Host, protocol: int) -> JoinConfig:
    """What `host`'s agent runs with: the broker as hosts reach it, the key every order is signed with, its registered
    ports, its cluster's shared folder, the fleet's task uid range and heartbeat interval."""
    shared = host.cluster.shared_dir.rstrip("/")
    return JoinConfig(
        host=host.name,
        server=agent_server_url(),
        control_key=control_public_key(),
        port_range=(host.port_min, host.port_max),
        shared_roots=[shared] if shared else [],
        task_uids=settings.TFDASH_AGENT_TASK_UIDS,
        heartbeat_interval_s=settings.TFDASH_AGENT_HEARTBEAT_S,
        protocol=protocol,
    )


def answer(host: Host, protocol: int) -> dict[str, Any]:
    """The signed answer to a join in `protocol` (the one the agent sealed its request in: it refuses any other)."""
    body = asdict(config_for(host, protocol))
    return sign_order(control_private_key(), host.name, AGENT_JOIN, body, protocol=protocol)


def control_plane_url(request: HttpRequest) -> str:
    """The address hosts join at, as the commands shown to staff name it: TFDASH_PUBLIC_URL when set (the dashboard's
    public address), else the one this request came to."""
    return (settings.TFDASH_PUBLIC_URL or request.build_absolute_uri("/")).rstrip("/")
