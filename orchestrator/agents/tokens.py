"""Agent tokens: shown once in plain text and never stored. What is stored is the key HKDF derives from the token for
the host's messages (contracts.signing.agent_mac_key), encrypted with a key of the control plane's
(orchestrator/agents/keys.py); the agent keeps only that derived key in memory too.

Tokens are 256 random bits, so no password stretching is needed.
"""

from __future__ import annotations

import secrets

TOKEN_PREFIX = "tfa_"  # noqa: S105 - a marker, not a secret


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)
