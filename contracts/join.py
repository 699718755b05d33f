"""How an agent joins the control plane (`tfdash-agent join URL ...`, worker_agent/command.py): what it asks, where, and
the configuration it gets back (orchestrator/api/agent_views.py answers).

The request is a message sealed with the host's key like every agent message (contracts/signing.py `seal`: its token
never travels) named AGENT_JOIN, POSTed as JSON to JOIN_PATH. The answer is the host's configuration, signed by the
control plane's Ed25519 key as an order of kind AGENT_JOIN for that host (`sign_order`): an agent whose admin pinned
the control key (`--control-key`) checks the answer against it, so neither a proxy nor anyone on the way can swap the
broker address or the key the agent will trust for every order after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from contracts.names import is_host_name

AGENT_JOIN = "agent.join"
JOIN_PATH = "/api/agents/join/"
# Both are a few hundred bytes; anything much larger is not one.
MAX_REQUEST_BYTES = 16 * 1024
MAX_ANSWER_BYTES = 64 * 1024
MAX_SHARED_ROOTS = 16


@dataclass(frozen=True)
class JoinConfig:
    """What the control plane tells a joining host (none of it secret: the broker URL has no credentials)."""

    host: str
    server: str  # the broker as hosts reach it (TFDASH_AGENT_SERVER_URL), no user or password
    control_key: str  # the control plane's public key (contracts/signing.py public_key_text)
    port_range: tuple[int, int]
    shared_roots: list[str] = field(default_factory=list)
    task_uids: str = ""  # "A-B" when the fleet runs tasks under uids of their own (agent as root); "" otherwise
    heartbeat_interval_s: float = 3.0
    protocol: int = 0  # the protocol the control plane answered in


def config_from(raw: Any) -> JoinConfig:
    """A join answer's body checked field by field (it is written to a file and started from); ValueError with the
    field when it is not one."""
    if not isinstance(raw, dict):
        raise ValueError("the join answer is not an object")

    def text(name: str, limit: int, *, required: bool = True) -> str:
        value = raw.get(name, "")
        if not isinstance(value, str) or len(value) > limit or (required and not value):
            raise ValueError(f"join answer: {name} must be a text of 1 to {limit} characters")
        return value

    host = text("host", 63)
    if not is_host_name(host):
        raise ValueError(f"join answer: host {host!r} is not a host name")
    ports = raw.get("port_range")
    if (
        not isinstance(ports, list | tuple)
        or len(ports) != 2
        or not all(type(p) is int for p in ports)
        or not 1024 <= ports[0] <= ports[1] <= 65535
    ):
        raise ValueError(f"join answer: port_range must be [first, last] within 1024..65535, not {ports!r}")
    roots = raw.get("shared_roots", [])
    if (
        not isinstance(roots, list)
        or len(roots) > MAX_SHARED_ROOTS
        or not all(isinstance(r, str) and r.startswith("/") and 1 < len(r) <= 4096 for r in roots)
    ):
        raise ValueError("join answer: shared_roots must be a list of absolute paths")
    interval = raw.get("heartbeat_interval_s", 3.0)
    if type(interval) not in (int, float) or not math.isfinite(interval) or not 0.1 <= interval <= 60:
        raise ValueError("join answer: heartbeat_interval_s must be between 0.1 and 60")
    protocol = raw.get("protocol", 0)
    if type(protocol) is not int:
        raise ValueError("join answer: protocol must be a number")
    return JoinConfig(
        host=host,
        server=text("server", 2048),
        control_key=text("control_key", 4096),
        port_range=(ports[0], ports[1]),
        shared_roots=list(roots),
        task_uids=text("task_uids", 40, required=False),
        heartbeat_interval_s=float(interval),
        protocol=protocol,
    )
