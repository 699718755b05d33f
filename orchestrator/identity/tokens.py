"""Agent tokens: shown once in plain text and never stored. What is stored is the key HKDF derives from the token for
the host's messages (contracts.signing.agent_mac_key), encrypted with a key of the control plane's
(orchestrator/identity/keys.py); the agent keeps only that derived key in memory too. The host's broker password is
derived from that key (contracts/broker.py), so issuing a token also gives the host a new broker user.

Tokens are 256 random bits, so no password stretching is needed.
"""

from __future__ import annotations

import secrets
import shlex

from django.db import transaction

from contracts.signing import agent_mac_key
from orchestrator.identity import broker_users, keys
from orchestrator.models import Host

TOKEN_PREFIX = "tfa_"  # noqa: S105 - a marker, not a secret


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def issue(host: Host, using: str | None = None) -> str:
    """Give `host` a fresh token, save the row, and return the token in plain text: the only time anyone sees it.
    Only the key derived from it is kept (encrypted); the host's name is part of that derivation, so a renamed host
    needs a new token. Once the row is committed, the host's broker user is set to the new password and its open
    connections are closed, so the old token stops working on the broker at once too."""
    token = set_new_token(host)
    if host.pk is None:
        host.save(using=using)
    else:
        host.save(using=using, update_fields=["agent_key"])
    name = host.name
    transaction.on_commit(lambda: broker_users.apply_quietly(name, using), using=using)
    return token


def set_new_token(host: Host) -> str:
    """`issue` without saving, for rows made in bulk: their broker users follow with the next `broker_users.sync`."""
    token = new_token()
    host.agent_key = keys.seal_host_key(host.name, agent_mac_key(token, host.name))
    return token


def mac_key(host: Host) -> bytes | None:
    """The key this host's messages must be MACed with; None when it has none (or it does not open)."""
    return keys.open_host_key(host.name, host.agent_key) if host.agent_key else None


def check_token(host: Host, token: str) -> bool:
    key = mac_key(host)
    return key is not None and secrets.compare_digest(key, agent_mac_key(token, host.name))


def agent_command(host: Host, server: str, token_file: str = "tfdash-agent.token") -> list[str]:  # noqa: S107 - a file name
    """How to start this host's agent. The token goes into `token_file` (mode 0600), never onto the command line
    (a flag shows in `ps`); `--server` names the broker with no credentials (the agent signs in as its host's own
    user, with a password derived from the token); `--control-key` is the control plane's public key, which the
    agent pins to check every order; `--shared-root` the cluster's shared folder, the only place besides its workdir
    where the agent makes a job's folder."""
    shared = ["--shared-root", host.cluster.shared_dir] if host.cluster.shared_dir else []
    return [
        "python",
        "-m",
        "worker_agent",
        "--server",
        server,
        "--host",
        host.name,
        "--token-file",
        token_file,
        "--control-key",
        keys.control_public_key(),
        "--port-range",
        f"{host.port_min}-{host.port_max}",
        *shared,
    ]


# Where the docs' systemd unit reads them (docs/admin/add-a-machine.md): a root agent's files.
TOKEN_PATH = "/etc/tfdash-agent/token"  # noqa: S105 - a file name, not a secret


def agent_commands(host: Host, url: str, token_file: str = TOKEN_PATH) -> dict[str, str]:
    """The commands that put this host's agent in service from its own distribution (agent/pyproject.toml), each a
    shell line: `install` it (a checkout's ./agent, or the wheel `make dist` builds), `join` this control plane at
    `url` (asks for the host's configuration, sealed with its token, which never travels, and writes it once; the
    control key is pinned by the command, so the answer cannot swap it), then `run` it. None holds the token: it
    goes into `token_file` (mode 0600)."""
    join = ["tfdash-agent", "join", url, "--host", host.name, "--token-file", token_file]
    join += ["--control-key", keys.control_public_key()]
    return {
        "install": "python3 -m pip install ./agent",
        "join": shlex.join(join),
        "run": "tfdash-agent run",
    }
