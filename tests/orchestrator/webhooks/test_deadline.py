"""Each webhook delivery has one deadline in all (connect, send, read): a receiver that answers a byte a second is cut
at it, the delivery is tried again after its backoff, a claimed delivery is never claimed again while its POST runs,
and stalled receivers do not hold back a healthy one's delivery."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from orchestrator.models import Job, Webhook, WebhookDelivery
from orchestrator.webhooks import delivering, hooks, outbox, sending
from tests import factories
from tests.orchestrator.webhooks.receiver import Receiver, SlowReceiver
from tests.support.processes import wait_until

DEADLINE_S = 3.0
# The most a cut may come after the deadline on a busy machine (a timer thread's wake-up, the receiver's 0.2 s poll).
LATE_S = 1.5


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("carol", password="pw-carol-123", is_staff=True)


@pytest.fixture
def short_deadline(settings):
    settings.TFDASH_WEBHOOK_DEADLINE_S = DEADLINE_S
    settings.TFDASH_WEBHOOK_RETRY_BASE_S = 1.0
    settings.TFDASH_WEBHOOK_RETRY_MAX_S = 2.0


def register(staff, url: str) -> tuple[Webhook, str]:
    hook, secret, errors = hooks.create(staff, url, allow_private=True, events=["succeeded"])
    assert not errors, errors
    return hook, secret


def a_change(owner) -> Job:
    job = Job.objects.create(owner=owner, cluster=factories.cluster(), name="j", strategy="mirrored",
                             program_kind="script", state="running", attempt=1)  # fmt: skip
    Job.objects.filter(pk=job.pk).update(state="succeeded")
    return job


def test_a_receiver_answering_a_byte_a_second_is_cut_at_the_deadline():
    slow = SlowReceiver()
    try:
        began = time.monotonic()
        answer = sending.post(slow.url, b"{}", {}, b"k", allow_private=True, deadline_s=DEADLINE_S)
        took = time.monotonic() - began
        # Per-read timeouts alone never fire here: each byte comes within a second, the whole answer in 41 s.
        assert DEADLINE_S - 0.1 <= took < DEADLINE_S + LATE_S, took
        assert answer.status is None and not answer.delivered
        assert f"within the {DEADLINE_S:g} s deadline" in answer.detail, answer.detail
        held = wait_until(slow.held_s, 5, what="the receiver to see the connection closed")
        assert len(held) == 1 and held[0] < DEADLINE_S + LATE_S, held
    finally:
        slow.stop()


@pytest.mark.django_db(transaction=True)
def test_stalled_receivers_do_not_hold_back_a_healthy_one_and_each_is_retried_after_its_backoff(staff, short_deadline):
    slows = [SlowReceiver() for _ in range(10)]
    healthy = Receiver()
    healthy.start()
    try:
        for slow in slows:
            register(staff, slow.url)
        _, healthy.secret = register(staff, healthy.url)
        a_change(staff)
        began = time.monotonic()
        sweeper = threading.Thread(target=_sweep_once)
        sweeper.start()
        wait_until(lambda: healthy.received, 2.0, interval=0.05, what="the healthy receiver's POST")
        healthy_after = time.monotonic() - began
        sweeper.join(timeout=DEADLINE_S + 10)
        swept_in = time.monotonic() - began
    finally:
        healthy.stop()
        for slow in slows:
            slow.stop()
    assert healthy_after < DEADLINE_S, healthy_after  # not behind the stalled ones
    assert swept_in < DEADLINE_S + LATE_S + 2, swept_in  # all ten POSTs at once, each cut at the deadline
    held = [s for slow in slows for s in slow.held_s()]
    assert len(held) == 10 and all(DEADLINE_S - 0.5 < s < DEADLINE_S + LATE_S for s in held), held
    stalled = WebhookDelivery.objects.exclude(webhook__url=healthy.url)
    assert stalled.count() == 10
    now = timezone.now()
    for delivery in stalled:
        assert (delivery.state, delivery.attempts, delivery.last_status) == ("pending", 1, None)
        assert "deadline" in delivery.last_error, delivery.last_error
        # Tried again after the first backoff (1 s here), not left to a lease that outlasts the POST.
        assert delivery.next_attempt_at <= now + timedelta(seconds=1.5), (delivery.next_attempt_at, now)
    assert WebhookDelivery.objects.get(webhook__url=healthy.url).state == "delivered"


@pytest.mark.django_db(transaction=True)
def test_a_delivery_is_never_claimed_again_while_its_post_runs(staff, short_deadline, settings):
    settings.TFDASH_WEBHOOK_RETRY_BASE_S = settings.TFDASH_WEBHOOK_RETRY_MAX_S = 0.5  # a retry as soon as may be
    slow = SlowReceiver()
    try:
        register(staff, slow.url)
        a_change(staff)
        # Two sweepers, as two webhooks workers would be, sweeping without a pause for three deadlines.
        end = time.monotonic() + 3 * DEADLINE_S
        sweepers = [threading.Thread(target=_sweep_until, args=(end,)) for _ in range(2)]
        for each in sweepers:
            each.start()
        for each in sweepers:
            each.join(timeout=6 * DEADLINE_S)
        assert not any(each.is_alive() for each in sweepers)
        wait_until(lambda: len(slow.held_s()) == len(slow.connections), 5, what="every connection closed")
    finally:
        slow.stop()
    assert len(slow.connections) >= 2  # tried again after each cut...
    assert slow.most_at_once == 1  # ...but never two POSTs of one delivery at once
    assert delivering.lease_s() > DEADLINE_S
    delivery = WebhookDelivery.objects.get()
    assert delivery.attempts == len(slow.connections)


@pytest.mark.django_db
def test_an_outcome_is_written_only_under_its_own_claim(staff, short_deadline):
    register(staff, "http://127.0.0.1:9/")
    a_change(staff)
    outbox.fan_out()
    WebhookDelivery.objects.update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    first = delivering._claim(1)[0]
    # Its lease ran out (a paused sweep) and another sweep claimed it again.
    WebhookDelivery.objects.update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    second = delivering._claim(1)[0]
    assert first.claim != second.claim
    assert delivering._record(first, sending.Answer(200, "ok")) == 0  # the late outcome changes nothing
    row = WebhookDelivery.objects.get()
    assert (row.state, row.attempts) == ("pending", 0)
    assert delivering._record(second, sending.Answer(200, "ok")) == 1
    assert WebhookDelivery.objects.get().state == "delivered"


def _sweep_once() -> None:
    try:
        outbox.sweep(budget_s=0.5)
    finally:
        connection.close()


def _sweep_until(end: float) -> None:
    try:
        while time.monotonic() < end:
            outbox.sweep(budget_s=0.2)
            time.sleep(0.05)
    finally:
        connection.close()
