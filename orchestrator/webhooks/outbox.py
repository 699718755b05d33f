"""From the outbox of job state changes to delivered POSTs, at least once.

`sweep()` (a Celery beat task every TFDASH_WEBHOOK_SWEEP_S, run by the webhooks worker alone: never on the
orchestrator's queue, whose threads handle the hosts' events, the watchdog and scheduling) does two things, each
safe to run in several workers at once (rows claimed with SKIP LOCKED):
1. fan out: each new JobStateChange (written by the jobs table's trigger, in the state change's own transaction)
   becomes one WebhookDelivery per matching active hook of an active owner (the owner's, and staff's hooks on the
   job's cluster, that subscribed to that state), with its idempotency key and the exact body to sign; the change
   row is then deleted. A change to failed or timed out waits (VERDICT_WAIT_S at most) for the job's verdict, which
   its body carries.
2. deliver (delivering.py): each delivery that is due is claimed when a thread is free to POST it, POSTed within its
   deadline, and marked delivered only after a 2xx answer; otherwise it is tried again after a backoff
   (TFDASH_WEBHOOK_RETRY_BASE_S doubling up to TFDASH_WEBHOOK_RETRY_MAX_S) until TFDASH_WEBHOOK_MAX_ATTEMPTS, then
   marked failed. A worker that dies mid-POST leaves the claim to expire, and the POST is sent again with the same
   key: the receiver deduplicates.
A sweep goes on fanning out and starting POSTs for TFDASH_WEBHOOK_SWEEP_BUDGET_S while it has POSTs in flight, then
waits for those (each ends by its deadline): a change made while slow receivers are being waited on is still sent
within a fraction of a second.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import DurationField, ExpressionWrapper, F
from django.db.models.functions import Now
from django.utils import timezone

from orchestrator.models import Job, JobStateChange, Webhook, WebhookDelivery
from orchestrator.webhooks import delivering

log = logging.getLogger(__name__)

FAN_OUT_BATCH = 500
# How often a sweep with POSTs in flight looks for new changes and due deliveries.
POLL_S = 0.25
# A failed or timed-out job's verdict (Job.diagnosis, its `diagnosis` in the body) is made just after the transaction
# that ended it commits (orchestrator/diagnosis/store.py, in milliseconds): its change waits in the outbox until the
# verdict is on the row, for at most this long (by the database's clock), then goes without one.
VERDICT_WAIT_S = 10.0
DIAGNOSED_STATES = ("failed", "timed_out")  # orchestrator/diagnosis/store.py's, which webhooks may not import: tested


def sweep(budget_s: float | None = None) -> tuple[int, int]:
    """Fan out and deliver for up to `budget_s` (TFDASH_WEBHOOK_SWEEP_BUDGET_S), then let the POSTs in flight end:
    (deliveries made, deliveries that succeeded). Returns at once when there is nothing to send."""
    budget = budget_s if budget_s is not None else settings.TFDASH_WEBHOOK_SWEEP_BUDGET_S
    end = time.monotonic() + budget
    limit = settings.TFDASH_WEBHOOK_CONCURRENCY
    made = 0
    with delivering.pool(limit) as pool:
        posts = delivering.Posts(pool, limit)
        while True:
            claimed = 0
            if time.monotonic() < end:
                made += fan_out()
                claimed = posts.top_up()
            if not posts.running:
                if claimed:  # all given up unsent (a disabled hook, say): look again at once
                    continue
                break
            posts.collect(POLL_S)
    return made, posts.delivered


# --- fan out --------------------------------------------------------------------------------------------------------
def fan_out() -> int:
    with transaction.atomic():
        outbox = JobStateChange.objects.select_for_update(skip_locked=True).order_by("id")
        age = ExpressionWrapper(Now() - F("at"), output_field=DurationField())
        changes = list(outbox.annotate(age=age)[:FAN_OUT_BATCH])
        if not changes:
            return 0
        jobs = Job.objects.select_related("owner", "cluster", "failed_task").in_bulk({c.job_id for c in changes})
        # A deactivated user's hooks hear nothing more (what they had queued is given up unsent: delivering.py).
        active = list(Webhook.objects.filter(active=True, owner__is_active=True).select_related("owner"))
        now = timezone.now()
        deliveries = []
        waiting = set()
        for change in changes:
            job = jobs.get(change.job_id)
            if job is None:
                continue
            if _awaits_verdict(change, job):
                waiting.add(change.pk)
                continue
            for hook in active:
                if change.state in hook.events and _hears_of(hook, job):
                    delivery = WebhookDelivery(
                        webhook=hook, change=change.pk, job=job, event=f"job.{change.state}", next_attempt_at=now
                    )
                    delivery.body = body_of(delivery, job, change)
                    deliveries.append(delivery)
        WebhookDelivery.objects.bulk_create(deliveries, ignore_conflicts=True)
        JobStateChange.objects.filter(pk__in=[c.pk for c in changes if c.pk not in waiting]).delete()
    return len(deliveries)


def _awaits_verdict(change: JobStateChange, job: Job) -> bool:
    """A change to failed or timed out whose job, still in that state, has no verdict yet, for VERDICT_WAIT_S."""
    return (
        change.state in DIAGNOSED_STATES
        and job.state == change.state
        and not job.diagnosis
        and change.age.total_seconds() < VERDICT_WAIT_S  # type: ignore[attr-defined]
    )


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
    title = _verdict(job).get("title") if change.state in DIAGNOSED_STATES else None
    if isinstance(title, str) and title:
        text += f" — why: {title[:300]}"
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
        # Why it failed or timed out: the API's `diagnosis` (docs/api.md); {} for other changes.
        "diagnosis": _verdict(job) if change.state in DIAGNOSED_STATES else {},
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


def _verdict(job: Job) -> dict[str, Any]:
    return job.diagnosis if isinstance(job.diagnosis, dict) else {}


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None
