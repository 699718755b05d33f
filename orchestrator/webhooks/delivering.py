"""Delivering what the outbox made (outbox.py): due deliveries claimed, POSTed several at once, each outcome written.

Each POST runs in a thread of a bounded pool (TFDASH_WEBHOOK_CONCURRENCY), inside the webhooks worker alone (the
`webhooks` queue: contracts/protocol.py), and ends by its deadline (sending.py) whatever the receiver does: so a
receiver that answers a byte a second costs one pool thread for TFDASH_WEBHOOK_DEADLINE_S and nothing else, and a
healthy receiver's delivery does not queue behind it. A delivery is claimed only when a thread is free to POST it at
once, so its lease (lease_s) covers exactly one POST: it can never be claimed twice at once.
"""

from __future__ import annotations

import logging
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from orchestrator.models import DeliveryState, WebhookDelivery
from orchestrator.webhooks import hooks, sending

log = logging.getLogger(__name__)


KEY_ROTATED = "the webhook's secret no longer opens (control key rotated): register it again"


def lease_s() -> float:
    """How long a claimed delivery is held from other sweeps: its POST's deadline, that again for a name lookup that
    overran it (the resolver cannot be interrupted) and the outcome's write, and 10 s for a busy database."""
    return settings.TFDASH_WEBHOOK_DEADLINE_S * 2 + 10


def backoff_s(attempts: int) -> float:
    """The wait after the `attempts`-th failed try."""
    base = settings.TFDASH_WEBHOOK_RETRY_BASE_S
    return float(min(base * 2 ** (attempts - 1), settings.TFDASH_WEBHOOK_RETRY_MAX_S))


@dataclass(frozen=True)
class _Try:
    delivery: WebhookDelivery
    claim: uuid.UUID


class Posts:
    """The POSTs one sweep has in flight, at most `limit` at once, in a pool of as many threads."""

    def __init__(self, pool: ThreadPoolExecutor, limit: int) -> None:
        self.pool = pool
        self.limit = limit
        self.running: dict[Future[sending.Answer], _Try] = {}
        self.delivered = 0

    def top_up(self) -> int:
        """Claim as many due deliveries as there are free threads and start their POSTs; how many were claimed."""
        free = self.limit - len(self.running)
        if free <= 0:
            return 0
        claimed = _claim(free)
        for each in claimed:
            refusal = _refusal(each.delivery)
            secret = hooks.secret_of(each.delivery.webhook)
            if refusal or secret is None:
                _give_up(each, refusal or KEY_ROTATED)
                continue
            self.running[self.pool.submit(_post, each.delivery, secret)] = each
        return len(claimed)

    def collect(self, wait_s: float) -> None:
        """Wait up to `wait_s` for POSTs to end, and write the outcome of each that did."""
        if not self.running:
            return
        done, _ = wait(list(self.running), timeout=wait_s, return_when=FIRST_COMPLETED)
        for future in done:
            each = self.running.pop(future)
            try:
                answer = future.result()
            except Exception as exc:  # a bug in one POST must not lose the others' outcomes
                log.exception("webhook delivery %s: the POST raised", each.delivery.key)
                answer = sending.Answer(None, f"{type(exc).__name__}: {exc}"[:300])
            self.delivered += _record(each, answer)


def pool(limit: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=limit, thread_name_prefix="webhook-post")


def _claim(limit: int) -> list[_Try]:
    now = timezone.now()
    claim = uuid.uuid4()
    with transaction.atomic():
        due = WebhookDelivery.objects.select_for_update(skip_locked=True).filter(
            state=DeliveryState.PENDING, next_attempt_at__lte=now
        )
        ids = list(due.order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
        if not ids:
            return []
        WebhookDelivery.objects.filter(pk__in=ids).update(
            next_attempt_at=now + timedelta(seconds=lease_s()), claim=claim
        )
    rows = WebhookDelivery.objects.filter(pk__in=ids, claim=claim).select_related("webhook__owner").order_by("pk")
    return [_Try(row, claim) for row in rows]


def _refusal(delivery: WebhookDelivery) -> str:
    """Why this delivery is never to be POSTed ("" when it may be)."""
    hook = delivery.webhook
    if not hook.active:
        return "the webhook is disabled"
    if not hook.owner.is_active:
        return "the webhook's owner is deactivated"
    return ""


def _post(delivery: WebhookDelivery, secret: bytes) -> sending.Answer:
    """In a pool thread: no database here, only the network."""
    hook = delivery.webhook
    return sending.post(
        hook.url,
        bytes(delivery.body),
        {"X-Tfdash-Event": delivery.event, "X-Tfdash-Delivery": str(delivery.key),
         "Idempotency-Key": str(delivery.key)},
        secret,
        allow_private=hook.allow_private,
        deadline_s=settings.TFDASH_WEBHOOK_DEADLINE_S,
    )  # fmt: skip


def _give_up(each: _Try, why: str) -> None:
    """Never sent: failed at once, with the reason in its log (a disabled hook or deactivated owner hears nothing)."""
    WebhookDelivery.objects.filter(pk=each.delivery.pk, state=DeliveryState.PENDING, claim=each.claim).update(
        state=DeliveryState.FAILED, last_status=None, last_error=why[:500]
    )


def _record(each: _Try, answer: sending.Answer) -> int:
    delivery = each.delivery
    attempts = delivery.attempts + 1
    now = timezone.now()
    fields: dict[str, Any] = {"attempts": F("attempts") + 1, "last_status": answer.status, "last_error": ""}
    if answer.delivered:
        fields.update(state=DeliveryState.DELIVERED, delivered_at=now)
    else:
        fields["last_error"] = answer.detail[:500]
        if attempts >= settings.TFDASH_WEBHOOK_MAX_ATTEMPTS:
            fields["state"] = DeliveryState.FAILED
        else:
            fields["next_attempt_at"] = now + timedelta(seconds=backoff_s(attempts))
        log.info(
            "webhook %s delivery %s try %d: %s %s",
            delivery.webhook_id, delivery.key, attempts, answer.status, answer.detail,
        )  # fmt: skip
    # Only while still pending and still this try's claim: never moved back from delivered, never over a later try.
    written = WebhookDelivery.objects.filter(pk=delivery.pk, state=DeliveryState.PENDING, claim=each.claim).update(
        **fields
    )
    return int(answer.delivered and written == 1)
