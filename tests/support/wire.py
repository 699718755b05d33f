"""Messages as the real parts build them, for tests that play an agent or the control plane: sealed agent messages
(contracts.signing.seal under the key an agent derives from its token) and orders signed with the test session's
control key (tests/settings.py generates a throwaway one)."""

from __future__ import annotations

from typing import Any

from contracts import broker
from contracts.signing import agent_mac_key, seal, sign_order


def sealed(host: str, token: str, name: str, body: Any, *, now: float | None = None) -> dict[str, Any]:
    """What host `host`'s agent, holding `token`, sends as message `name`."""
    return seal(agent_mac_key(token, host), host, name, body, now=now)


def signed_order(host: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """An order to `host`'s agent, signed as the orchestrator signs it."""
    from orchestrator.identity.keys import control_private_key  # Django settings: only where the test has them

    return sign_order(control_private_key(), host, kind, body)


def control_key_flags() -> list[str]:
    """The flags that give an agent the control plane's public key (which it pins to check every order)."""
    from orchestrator.identity.keys import control_public_key

    return ["--control-key", control_public_key()]


def broker_user(redis_url: str, host: str, token: str) -> str:
    """Give `host` its broker user for `token` straight in Redis, as the control plane does for a registered host
    (orchestrator/identity/broker_users.py): for tests that run an agent of a host the database does not know.
    Returns the URL the agent signs in with."""
    import redis

    password = broker.password(agent_mac_key(token, host), host)
    redis.Redis.from_url(redis_url).execute_command(
        "ACL", "SETUSER", broker.username(host), *broker.acl_rules(host, password)
    )
    return broker.server_url(broker.without_credentials(redis_url), host, password)
