"""Messages as the real parts build them, for tests that play an agent or the control plane: sealed agent messages
(contracts.signing.seal under the key an agent derives from its token) and orders signed with the test session's
control key (tests/settings.py generates a throwaway one)."""

from __future__ import annotations

from typing import Any

from contracts.signing import agent_mac_key, seal, sign_order


def sealed(host: str, token: str, name: str, body: Any, *, now: float | None = None) -> dict[str, Any]:
    """What host `host`'s agent, holding `token`, sends as message `name`."""
    return seal(agent_mac_key(token, host), host, name, body, now=now)


def signed_order(host: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """An order to `host`'s agent, signed as the orchestrator signs it."""
    from orchestrator.agents.keys import control_private_key  # Django settings: only where the test has them

    return sign_order(control_private_key(), host, kind, body)


def control_key_flags() -> list[str]:
    """The flags that give an agent the control plane's public key (which it pins to check every order)."""
    from orchestrator.agents.keys import control_public_key

    return ["--control-key", control_public_key()]
