"""A deactivated user's webhooks stop: a change after the deactivation is not queued for them, and what was queued
before is given up unsent (the delivery log says why); the hooks of active users go on."""

from __future__ import annotations

import pytest

from orchestrator.identity import keys
from orchestrator.models import Job, JobStateChange, Webhook, WebhookDelivery
from orchestrator.webhooks import outbox
from tests import factories
from tests.orchestrator.webhooks.receiver import Receiver
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db


def hook_of(owner, receiver: Receiver) -> Webhook:
    # As a row: only staff may register a loopback receiver, and these owners are not staff.
    receiver.secret = f"secret-of-{owner.username}"
    hook = Webhook(owner=owner, url=receiver.url, events=["running", "succeeded"], allow_private=True)
    hook.secret_sealed = keys.seal_host_key(f"webhook:{hook.label}", receiver.secret.encode())
    hook.save()
    return hook


def change(owner, state: str) -> Job:
    job = Job.objects.create(owner=owner, cluster=factories.cluster(), name=f"j-{state}", strategy="mirrored",
                             program_kind="script", state="queued", attempt=1)  # fmt: skip
    Job.objects.filter(pk=job.pk).update(state=state)
    return job


def test_a_deactivated_users_webhooks_are_neither_queued_nor_sent(alice, bob):
    alices, bobs = Receiver(), Receiver()
    alices.start()
    bobs.start()
    try:
        alice_hook, bob_hook = hook_of(alice, alices), hook_of(bob, bobs)
        change(alice, "running")  # queued while alice was active...
        change(bob, "running")
        outbox.fan_out()
        assert WebhookDelivery.objects.filter(webhook=alice_hook).count() == 1
        alice.is_active = False  # ...then she is deactivated before it is sent
        alice.save()
        change(alice, "succeeded")  # and her job changes again
        change(bob, "succeeded")

        def swept() -> bool:
            outbox.sweep()
            return len(bobs.received) == 2 and not JobStateChange.objects.exists()

        wait_until(swept, 20, interval=0.1, what="bob's two deliveries")
    finally:
        alices.stop()
        bobs.stop()

    assert alices.received == []  # nothing sent for alice's hook...
    alice_deliveries = list(WebhookDelivery.objects.filter(webhook=alice_hook))
    assert len(alice_deliveries) == 1  # ...and nothing queued after her deactivation
    given_up = alice_deliveries[0]
    assert (given_up.state, given_up.attempts) == ("failed", 0)
    assert given_up.last_error == "the webhook's owner is deactivated"
    assert sorted(p["state"] for p in bobs.payloads()) == ["running", "succeeded"]
    assert WebhookDelivery.objects.filter(webhook=bob_hook, state="delivered").count() == 2
