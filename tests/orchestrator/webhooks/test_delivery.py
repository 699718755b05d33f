"""Webhooks against a real receiver on loopback (staff allowed it): a signed POST for each job state change, written
to the outbox by the state change itself; a receiver down past the retries' cap (the issue's 30 s outage, on a clock
four times faster) gets each delivery exactly once after it returns;
private addresses refused at registration and at delivery; no redirect followed."""

from __future__ import annotations

import time

import pytest

from orchestrator.jobs import lifecycle
from orchestrator.models import Job, JobStateChange, Webhook, WebhookDelivery
from orchestrator.webhooks import hooks, outbox
from tests import factories
from tests.orchestrator.webhooks.receiver import Receiver
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db

# The outage: the receiver refuses connections for 30 s while retries back off 1, 2, 4, 8, 8 s apart. Here on
# a clock four times faster (backoffs 0.25 s doubling to 2 s, down 7.5 s): the same tries at the same points of the
# outage, the cap reached and held, a quarter of the wait.
SCALE = 0.25
DOWN_S = 30.0 * SCALE


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("carol", password="pw-carol-123", is_staff=True)


@pytest.fixture
def quick_retries(settings):
    settings.TFDASH_WEBHOOK_RETRY_BASE_S = 1.0
    settings.TFDASH_WEBHOOK_RETRY_MAX_S = 8.0
    settings.TFDASH_WEBHOOK_DEADLINE_S = 2.0


def a_job(owner, name: str = "mnist", state: str = "queued") -> Job:
    return Job.objects.create(owner=owner, cluster=factories.cluster(), name=name, strategy="mirrored",
                              program_kind="script", state=state, attempt=1)  # fmt: skip


def sweep_until(condition, timeout: float, what: str):
    def swept():
        outbox.sweep()
        return condition()

    return wait_until(swept, timeout, interval=0.1, what=what)


def register(user, receiver: Receiver, **fields) -> Webhook:
    hook, secret, errors = hooks.create(user, receiver.url, **fields)
    assert not errors, errors
    receiver.secret = secret
    return hook


def test_each_state_change_is_posted_signed_with_slack_text_and_the_record(staff, alice, quick_retries):
    receiver = Receiver()
    receiver.start()
    try:
        register(staff, receiver, cluster=factories.cluster(), allow_private=True,
                 events=["running", "succeeded", "failed", "cancelled"])  # fmt: skip
        done, bad, cancelled = a_job(alice, "done"), a_job(alice, "bad"), a_job(alice, "stopped")
        # Whatever code changes a state, the change is in the outbox in the same transaction.
        Job.objects.filter(pk__in=[done.pk, bad.pk, cancelled.pk]).update(state="running")
        Job.objects.filter(pk=done.pk).update(state="succeeded", reason="worker 0 exited 0")
        Job.objects.filter(pk=bad.pk).update(state="failed", reason="worker 1 exited 1")
        assert lifecycle.cancel(cancelled.pk, by="alice")
        assert JobStateChange.objects.count() == 3 + 3 + 3  # queued (insert), running, the end: all written

        sweep_until(lambda: len(receiver.received) == 6, 20, what="six POSTs")
    finally:
        receiver.stop()

    assert all(r["signature_ok"] for r in receiver.received)
    assert all(r["path"] == "/hook?x=1" for r in receiver.received)
    seen = sorted((p["job"]["name"], p["state"]) for p in receiver.payloads())
    assert seen == sorted([(n, "running") for n in ("done", "bad", "stopped")]
                          + [("done", "succeeded"), ("bad", "failed"), ("stopped", "cancelled")])  # fmt: skip
    failed = next(r for r in receiver.received if r["payload"]["state"] == "failed")
    payload = failed["payload"]
    assert payload["event"] == "job.failed" and payload["previous_state"] == "running"
    assert payload["text"].startswith(f"Job #{bad.pk} 'bad' failed: worker 1 exited 1")
    assert payload["job"]["owner"] == "alice" and payload["job"]["url"] == f"/jobs/{bad.pk}/"
    assert failed["headers"]["X-Tfdash-Event"] == "job.failed"
    assert failed["headers"]["X-Tfdash-Delivery"] == failed["headers"]["Idempotency-Key"] == payload["id"]
    log = WebhookDelivery.objects.get(key=payload["id"])
    assert (log.state, log.attempts, log.last_status) == ("delivered", 1, 200)
    assert not JobStateChange.objects.exists()  # fanned out, gone


@pytest.fixture
def quicker_retries(settings):
    settings.TFDASH_WEBHOOK_RETRY_BASE_S = 1.0 * SCALE
    settings.TFDASH_WEBHOOK_RETRY_MAX_S = 8.0 * SCALE
    settings.TFDASH_WEBHOOK_DEADLINE_S = 2.0


def test_a_receiver_down_for_30_s_on_a_4x_clock_gets_each_delivery_exactly_once_after_it_returns(
    staff, quicker_retries
):
    receiver = Receiver()  # bound but not listening: every connection is refused
    try:
        register(staff, receiver, allow_private=True)
        jobs = [a_job(staff, f"job-{i}", "running") for i in range(3)]
        for job, state in zip(jobs, ("succeeded", "failed", "cancelled"), strict=True):
            # A failed job's change waits for its verdict (outbox.VERDICT_WAIT_S): here it has one, as once its
            # end has committed.
            verdict = {"kind": "user_exception", "title": "worker 0 raised ValueError"} if state == "failed" else {}
            Job.objects.filter(pk=job.pk).update(state=state, diagnosis=verdict)
        down_until = time.monotonic() + DOWN_S
        while time.monotonic() < down_until:
            outbox.sweep()
            time.sleep(0.2 * SCALE)
        tries = {d.key: d.attempts for d in WebhookDelivery.objects.all()}
        assert len(tries) == 3 and all(n >= 3 for n in tries.values()), tries  # retried, backing off
        assert all(n <= 7 for n in tries.values()), tries  # ...not hammering (0.25, 0.5, 1, 2, 2 s apart)
        assert all("refused" in d.last_error.lower() for d in WebhookDelivery.objects.all())
        assert receiver.received == []

        receiver.start()
        sweep_until(lambda: WebhookDelivery.objects.filter(state="delivered").count() == 3, 20, what="all delivered")
        for _ in range(10):  # more sweeps send nothing again
            outbox.sweep()
    finally:
        receiver.stop()

    keys = [p["id"] for p in receiver.payloads()]
    assert sorted(keys) == sorted(str(k) for k in tries)  # each exactly once
    assert all(r["signature_ok"] for r in receiver.received)
    assert sorted(p["state"] for p in receiver.payloads()) == ["cancelled", "failed", "succeeded"]


def test_private_and_loopback_addresses_are_refused_unless_staff_allow_them(alice, staff, quick_retries):
    for url in ("http://127.0.0.1:9/", "http://localhost/x", "http://10.1.2.3/", "http://[::ffff:127.0.0.1]/",
                "http://169.254.169.254/latest/meta-data/", "http://[::1]:8080/"):  # fmt: skip
        hook, secret, errors = hooks.create(alice, url)
        assert hook is None and secret == ""
        assert "private, loopback or reserved" in errors["url"][0], (url, errors)
    _, _, errors = hooks.create(alice, "http://127.0.0.1:9/", allow_private=True, cluster=factories.cluster())
    assert "Only staff" in errors["allow_private"][0] and "Only staff" in errors["cluster"][0]
    for url, why in (("ftp://example.com/", "only http"), ("http://u:p@example.com/", "no user"),
                     ("http://", "names no host")):  # fmt: skip
        assert why in hooks.create(alice, url)[2]["url"][0]
    hook, secret, errors = hooks.create(staff, "http://127.0.0.1:9/", allow_private=True)
    assert hook is not None and len(secret) >= 40 and not errors
    assert secret not in hook.secret_sealed


def test_delivery_checks_the_address_again_and_follows_no_redirect(staff, alice, quick_retries):
    receiver = Receiver(status=302, headers={"Location": "http://127.0.0.1:1/elsewhere"})
    receiver.start()
    try:
        redirected = register(staff, receiver, allow_private=True)
        # Registered when its name was public; it resolves to loopback now (DNS changed): refused at delivery.
        rebound = register(staff, receiver, allow_private=True)
        Webhook.objects.filter(pk=rebound.pk).update(url=f"http://localhost:{receiver.port}/", allow_private=False)
        job = a_job(staff, state="running")
        Job.objects.filter(pk=job.pk).update(state="succeeded")
        sweep_until(lambda: WebhookDelivery.objects.filter(attempts__gte=1).count() == 2, 20, what="two tries")
    finally:
        receiver.stop()
    by_hook = {d.webhook_id: d for d in WebhookDelivery.objects.all()}
    assert by_hook[redirected.pk].state == "pending" and by_hook[redirected.pk].last_status == 302
    assert "redirect" in by_hook[redirected.pk].last_error
    assert by_hook[rebound.pk].last_status is None and "loopback" in by_hook[rebound.pk].last_error
    assert len(receiver.received) == 1  # the redirecting one; the rebound hook never connected


def test_no_outbox_rows_while_no_webhook_is_active(alice):
    job = a_job(alice, state="running")
    Job.objects.filter(pk=job.pk).update(state="succeeded")
    assert not JobStateChange.objects.exists()
