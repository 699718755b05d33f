"""A host's agent joining (contracts/join.py): the configuration it is told, signed for it by the control plane."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.http import HttpRequest

from contracts.join import AGENT_JOIN, JoinConfig
from contracts.signing import sign_order
from orchestrator.core.hosts import machine_of
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


def unreachable_addresses(host: Host) -> str:
    """Why `host`'s agent could not reach what the control plane would hand it, or "": a loopback address (the broker
    as `make run` and a one-machine control plane name it, 127.0.0.1; a store endpoint on localhost) handed to a host
    registered at another machine's address points that agent at its own machine. Its agent would retry forever
    without a word on the host page; refused at the join instead, with what to set."""
    if machine_of(host.address) == "loopback":
        return ""  # a host of the control plane's own machine reaches its loopback
    server = agent_server_url()
    if machine_of(urlsplit(server).hostname or "") == "loopback":
        return (f"host {host.name} is registered at {host.address}, another machine, but the broker address hosts are "
                f"given, {server}, is this control plane's loopback: set TFDASH_AGENT_SERVER_URL to the address hosts "
                f"reach Redis at (e.g. redis://tfdash.lab.example:6379/0) and let Redis listen there")  # fmt: skip
    store = host.cluster.store_endpoint
    if store and machine_of(urlsplit(store).hostname or "") == "loopback":
        return (f"host {host.name} is registered at {host.address}, another machine, but cluster "
                f"{host.cluster.name}'s object store endpoint, {store}, is loopback, so the presigned URLs its agent "
                f"gets would point at itself: set the endpoint to an address hosts reach")  # fmt: skip
    return ""


def answer(host: Host, protocol: int) -> dict[str, Any]:
    """The signed answer to a join in `protocol` (the one the agent sealed its request in: it refuses any other)."""
    body = asdict(config_for(host, protocol))
    return sign_order(control_private_key(), host.name, AGENT_JOIN, body, protocol=protocol)


def control_plane_url(request: HttpRequest) -> str:
    """The address hosts join at, as the commands shown to staff name it: TFDASH_PUBLIC_URL when set (the dashboard's
    public address), else the one this request came to."""
    return (settings.TFDASH_PUBLIC_URL or request.build_absolute_uri("/")).rstrip("/")
