"""Webhooks: a URL that hears of jobs' state changes, the outbox of those changes, and each delivery's log.

The outbox row (JobStateChange) is written by a PostgreSQL trigger on the jobs table (migration 0013), in the very
transaction that changes a job's state, whichever code path changes it (the lifecycle, the scheduler, experiments,
states added later): a change is never lost between the commit and a message, and no code path can forget it.
orchestrator/webhooks/ turns changes into deliveries and delivers them.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from orchestrator.models.clusters import Cluster
from orchestrator.models.jobs import Job, JobState

# Progress, not news: every other state (the final ones, restarting, and any added later: timed out, preempted) is
# one a webhook may subscribe to, so a new state needs no change here.
QUIET_STATES = (JobState.QUEUED, JobState.STARTING)
DEFAULT_EVENTS = [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]


def notable_states() -> list[str]:
    return [state for state in JobState.values if state not in QUIET_STATES]


class Webhook(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhooks")
    # Set (staff only): every job on that cluster, whoever owns it. Unset: the owner's own jobs.
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, null=True, blank=True, related_name="webhooks")
    name = models.CharField(max_length=100, blank=True)
    url = models.URLField(max_length=2000)
    events = models.JSONField(default=list, help_text="the job states that are posted")
    # The HMAC key, encrypted at rest under the control key (orchestrator/identity/keys.py); shown once at creation.
    secret_sealed = models.TextField()
    label = models.UUIDField(default=uuid.uuid4, editable=False, help_text="binds the sealed secret to this hook")
    # Staff only: a receiver on a private or loopback address (an internal chat bridge, a test receiver).
    allow_private = models.BooleanField(default=False)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name or self.url


class JobStateChange(models.Model):
    """The outbox: one job state change while any webhook is active (written by the trigger only)."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    state = models.CharField(max_length=16)
    previous_state = models.CharField(max_length=16, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.previous_state} -> {self.state}"


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # gave up after the last retry


class WebhookDelivery(models.Model):
    """One POST owed to one webhook for one change: its idempotency key, body and what became of each try."""

    id = models.BigAutoField(primary_key=True)
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    key = models.UUIDField(default=uuid.uuid4, unique=True, editable=False, help_text="the idempotency key")
    change = models.BigIntegerField(help_text="the JobStateChange it is for (gone once fanned out)")
    job = models.ForeignKey(Job, on_delete=models.SET_NULL, null=True, related_name="+")
    event = models.CharField(max_length=40)
    body = models.BinaryField(help_text="exactly the bytes signed and sent")
    state = models.CharField(max_length=10, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    # Who holds the try in flight (set when a sweep claims it, with next_attempt_at pushed past the POST's deadline):
    # a try's outcome is written only while its claim is still the row's, so a sweep that overran its lease (paused,
    # its host swapping) can never overwrite the outcome of the try that claimed the row after it.
    claim = models.UUIDField(null=True, blank=True, editable=False)
    last_status = models.IntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["webhook", "change"], name="one_delivery_per_hook_change")]
        indexes = [
            models.Index(fields=["next_attempt_at"], name="webhook_delivery_due", condition=models.Q(state="pending"))
        ]

    def __str__(self) -> str:
        return f"{self.event} -> {self.webhook_id} ({self.state})"
