"""Registering a webhook: the checks (who may ask for what, the URL, the states), the secret made and sealed."""

from __future__ import annotations

import secrets
from typing import Any

from django.db import transaction

from orchestrator.identity import keys
from orchestrator.models import Cluster, Webhook
from orchestrator.models.webhooks import DEFAULT_EVENTS, notable_states
from orchestrator.webhooks import addresses

Errors = dict[str, list[str]]
MAX_HOOKS_PER_USER = 20


def _label(hook: Webhook) -> str:
    return f"webhook:{hook.label}"


def secret_of(hook: Webhook) -> bytes | None:
    """The hook's HMAC key (None when it no longer opens: the control key was rotated)."""
    return keys.open_host_key(_label(hook), hook.secret_sealed)


def problems(user: Any, url: str, events: list[str] | None, cluster: Cluster | None, allow_private: bool) -> Errors:
    """What is wrong with a registration, by field."""
    errors: Errors = {}
    if cluster is not None and not user.is_staff:
        errors["cluster"] = ["Only staff may register a webhook for a whole cluster."]
    if allow_private and not user.is_staff:
        errors["allow_private"] = ["Only staff may allow private or loopback addresses."]
    allowed = notable_states()
    unknown = [e for e in (events or []) if e not in allowed]
    if events is not None and (not events or unknown):
        errors["events"] = [f"Choose among {', '.join(allowed)}" + (f"; not {unknown[0]!r}." if unknown else ".")]
    if Webhook.objects.filter(owner=user).count() >= MAX_HOOKS_PER_USER:
        errors["url"] = [f"At most {MAX_HOOKS_PER_USER} webhooks per user."]
    try:
        addresses.target(url, allow_private=allow_private and user.is_staff)
    except addresses.Refused as exc:
        errors.setdefault("url", []).append(f"{exc}.")
    return errors


def create(
    user: Any,
    url: str,
    *,
    events: list[str] | None = None,
    cluster: Cluster | None = None,
    allow_private: bool = False,
    name: str = "",
) -> tuple[Webhook | None, str, Errors]:
    """(the hook, its secret to show once, no errors) or (None, "", errors by field)."""
    errors = problems(user, url, events, cluster, allow_private)
    if errors:
        return None, "", errors
    secret = secrets.token_urlsafe(32)
    with transaction.atomic():
        hook = Webhook(
            owner=user, cluster=cluster, url=url, name=name, events=list(events or DEFAULT_EVENTS),
            allow_private=allow_private,
        )  # fmt: skip
        hook.secret_sealed = keys.seal_host_key(_label(hook), secret.encode())
        hook.save()
    return hook, secret, {}
