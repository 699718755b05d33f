"""Agent tokens: shown once in plain text, stored only as a SHA-256 digest.

Tokens are 256 random bits, so a fast hash is enough (no password stretching needed) and lookups stay cheap on every
heartbeat. Comparison is constant-time.
"""

from __future__ import annotations

import hmac
import secrets

from contracts.protocol import token_digest

TOKEN_PREFIX = "tfa_"  # noqa: S105 - a marker, not a secret


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    # The same digest the agent derives to check the orchestrator's signed orders (contracts.protocol).
    return token_digest(token)


def token_matches(token: str, token_hash: str) -> bool:
    if not token or not token_hash:
        return False
    return hmac.compare_digest(hash_token(token), token_hash)
