"""Users' API tokens (orchestrator.models.ApiToken): issued at each sign-in through `POST /api/token/` (`tfdash
login`) or on the API tokens page, each with an expiry (TFDASH_API_TOKEN_DAYS, 30 days), found by the hash of what a
client sends, revoked one at a time by their owner (`tfdash logout` revokes its own).

A token is `tfu_` and 256 random bits (URL-safe base64), so a plain SHA-256 is a sound way to store it: there is
nothing to guess, so no stretching is needed, and the lookup is one indexed equality.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from orchestrator import limits
from orchestrator.models import ApiToken

TOKEN_PREFIX = "tfu_"  # noqa: S105 - a marker (a secret scanner can spot a leaked token by it), not a secret
# What a token may look like on the wire: ours (tfu_ + 43 characters) and DRF's older ones (40 hex digits) both fit.
# Anything else is refused before it is hashed or looked up.
WELL_FORMED = re.compile(r"[A-Za-z0-9_-]{20,128}")
NAME_MAX = 100
# last_used_at is written at most this often per token, not on every request.
TOUCH_EVERY = timedelta(seconds=60)


class TooMany(Exception):
    """The user holds as many tokens as allowed; the message says so and what to do."""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def lifetime() -> timedelta:
    return timedelta(days=settings.TFDASH_API_TOKEN_DAYS)


def clean_name(name: str) -> str:
    """A name a client gave itself, shown back on a page: printable characters only, at most NAME_MAX."""
    return "".join(ch for ch in name if ch.isprintable()).strip()[:NAME_MAX]


def issue(user: Any, name: str = "", *, using: str | None = None) -> tuple[str, ApiToken]:
    """A fresh token for `user`: returned in plain text this once, stored only as its hash. The user's expired tokens
    are dropped first (they can never work again); TooMany when they already hold the limit."""
    now = timezone.now()
    tokens = ApiToken.objects.db_manager(using)
    with transaction.atomic(using=using):
        # The user's row, locked: two sign-ins at once must not both pass the count below. FOR NO KEY UPDATE, as
        # submission.lock_owner_and_count_active: it must not block other transactions' foreign-key checks of the user.
        get_user_model()._default_manager.db_manager(using).select_for_update(no_key=True).filter(pk=user.pk).exists()
        tokens.filter(user=user, expires_at__lte=now).delete()
        problem = limits.api_tokens_problem(tokens.filter(user=user).count())
        if problem:
            raise TooMany(problem)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        row = tokens.create(
            user=user,
            digest=digest(token),
            hint=token[: len(TOKEN_PREFIX) + 4],
            name=clean_name(name),
            created_at=now,
            expires_at=now + lifetime(),
        )
    return token, row


def find(token: str) -> ApiToken | None:
    """The row of a token as a client sent it (expired or not: the caller says which), None when there is none."""
    if not WELL_FORMED.fullmatch(token):
        return None
    return ApiToken.objects.select_related("user").filter(digest=digest(token)).first()


def touch(row: ApiToken) -> None:
    """Note that `row` was just used, at most once per TOUCH_EVERY (a page of requests costs no write each)."""
    now = timezone.now()
    if row.last_used_at is not None and now - row.last_used_at < TOUCH_EVERY:
        return
    ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    row.last_used_at = now


def revoke(user: Any, token_id: int) -> bool:
    """Delete one of `user`'s tokens; False when they have none by that id (another user's included)."""
    deleted, _ = ApiToken.objects.filter(user=user, pk=token_id).delete()
    return deleted > 0


def of(user: Any) -> list[ApiToken]:
    return list(ApiToken.objects.filter(user=user))
