"""From the outbox of job state changes to delivered POSTs, at least once.

`sweep()` (a Celery beat task, every TFDASH_WEBHOOK_SWEEP_S) does two things, each safe to run in several workers at
once (rows claimed with SKIP LOCKED):
1. fan out: each new JobStateChange (written by the jobs table's trigger, in the state change's own transaction)
   becomes one WebhookDelivery per matching active hook (the owner's, and staff's hooks on the job's cluster, that
   subscribed to that state), with its idempotency key and the exact body to sign; the change row is then deleted.
2. deliver: each delivery that is due is claimed (its next try pushed past the time a POST can take), POSTed, and
   marked delivered only after a 2xx answer; otherwise it is tried again after a backoff (TFDASH_WEBHOOK_RETRY_BASE_S
   doubling up to TFDASH_WEBHOOK_RETRY_MAX_S) until TFDASH_WEBHOOK_MAX_ATTEMPTS, then marked failed. A worker that dies
   mid-POST leaves the claim to expire, and the POST is sent again with the same key: the receiver deduplicates.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from orchestrator.models import DeliveryState, Job, JobStateChange, Webhook, WebhookDelivery
from orchestrator.webhooks import hooks, sending

log = logging.getLogger(__name__)

FAN_OUT_BATCH = 500
DELIVER_BATCH = 20


def sweep() -> tuple[int, int]:
    """One pass: (deliveries made, deliveries that succeeded)."""
    made = fan_out()
    return made, deliver_due()


# --- fan out --------------------------------------------------------------------------------------------------------
def fan_out() -> int:
    with transaction.atomic():
        changes = list(JobStateChange.objects.select_for_update(skip_locked=True).order_by("id")[:FAN_OUT_BATCH])
        if not changes:
            return 0
        jobs = Job.objects.select_related("owner", "cluster", "failed_task").in_bulk({c.job_id for c in changes})
        active = list(Webhook.objects.filter(active=True).select_related("owner"))
        now = timezone.now()
        deliveries = []
        for change in changes:
            job = jobs.get(change.job_id)
            if job is None:
                continue
            for hook in active:
                if change.state in hook.events and _hears_of(hook, job):
                    delivery = WebhookDelivery(
                        webhook=hook, change=change.pk, job=job, event=f"job.{change.state}", next_attempt_at=now
                    )
                    delivery.body = body_of(delivery, job, change)
                    deliveries.append(delivery)
        WebhookDelivery.objects.bulk_create(deliveries, ignore_conflicts=True)
        JobStateChange.objects.filter(pk__in=[c.pk for c in changes]).delete()
    return len(deliveries)


def _hears_of(hook: Webhook, job: Job) -> bool:
    if hook.cluster_id is not None:
        return hook.cluster_id == job.cluster_id and hook.owner.is_staff
    return hook.owner_id == job.owner_id


def body_of(delivery: WebhookDelivery, job: Job, change: JobStateChange) -> bytes:
    """The JSON posted: Slack-compatible `text`, the idempotency key, the change and the job's record."""
    page = job.get_absolute_url()
    base = settings.TFDASH_PUBLIC_URL.rstrip("/")
    link = f"{base}{page}" if base else page
    text = f"Job #{job.pk} {job.name!r} {change.state}"
    if job.reason:
        text += f": {job.reason[:300]}"
    record: dict[str, Any] = {
        "id": job.pk,
        "name": job.name,
        "owner": job.owner.get_username(),
        "cluster": job.cluster.name,
        "strategy": job.strategy,
        "workers": job.workers,
        "ps": job.ps,
        "state": job.state,
        "reason": job.reason,
        "attempt": job.attempt,
        "restarts": job.restarts,
        "created_at": _iso(job.created_at),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "failure": None,
        "url": link,
    }
    if job.failed_task is not None:
        task = job.failed_task
        record["failure"] = {"task": f"{task.type} {task.index}", "exit_code": task.exit_code}
    payload = {
        "id": str(delivery.key),  # the idempotency key: the same in every retry of this delivery
        "event": delivery.event,
        "state": change.state,
        "previous_state": change.previous_state,
        "at": _iso(change.at),
        "text": f"{text} ({link})",
        "job": record,
    }
    return json.dumps(payload, sort_keys=True).encode()


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


# --- deliver --------------------------------------------------------------------------------------------------------
def deliver_due(budget_s: float | None = None) -> int:
    """POST what is due, for at most `budget_s` (a sweep must end); returns how many were delivered."""
    deadline = time.monotonic() + (budget_s if budget_s is not None else settings.TFDASH_WEBHOOK_SWEEP_BUDGET_S)
    delivered = 0
    while time.monotonic() < deadline:
        claimed = _claim()
        if not claimed:
            break
        for delivery in claimed:
            delivered += _attempt(delivery)
    return delivered


def _claim() -> list[WebhookDelivery]:
    now = timezone.now()
    # Longer than one POST may take: until then no other sweeper takes it; after, a crashed one's is tried again.
    lease = timedelta(seconds=settings.TFDASH_WEBHOOK_TIMEOUT_S * 3 + 5)
    with transaction.atomic():
        due = WebhookDelivery.objects.select_for_update(skip_locked=True).filter(
            state=DeliveryState.PENDING, next_attempt_at__lte=now
        )
        ids = list(due.order_by("next_attempt_at").values_list("pk", flat=True)[:DELIVER_BATCH])
        WebhookDelivery.objects.filter(pk__in=ids).update(next_attempt_at=now + lease)
    return list(WebhookDelivery.objects.filter(pk__in=ids).select_related("webhook").order_by("pk"))


def _attempt(delivery: WebhookDelivery) -> int:
    hook = delivery.webhook
    secret = hooks.secret_of(hook)
    if not hook.active:
        answer = sending.Answer(None, "the webhook is disabled")
    elif secret is None:
        answer = sending.Answer(None, "the webhook's secret no longer opens (control key rotated): register it again")
    else:
        answer = sending.post(
            hook.url,
            bytes(delivery.body),
            {"X-Tfdash-Event": delivery.event, "X-Tfdash-Delivery": str(delivery.key),
             "Idempotency-Key": str(delivery.key)},
            secret,
            allow_private=hook.allow_private,
            timeout=settings.TFDASH_WEBHOOK_TIMEOUT_S,
        )  # fmt: skip
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
        log.info("webhook %s delivery %s try %d: %s %s", hook.pk, delivery.key, attempts, answer.status, answer.detail)
    # Only while still ours and pending: a delivery is never moved back from delivered.
    WebhookDelivery.objects.filter(Q(pk=delivery.pk) & Q(state=DeliveryState.PENDING)).update(**fields)
    return int(answer.delivered)


def backoff_s(attempts: int) -> float:
    """The wait after the `attempts`-th failed try."""
    base = settings.TFDASH_WEBHOOK_RETRY_BASE_S
    return float(min(base * 2 ** (attempts - 1), settings.TFDASH_WEBHOOK_RETRY_MAX_S))
