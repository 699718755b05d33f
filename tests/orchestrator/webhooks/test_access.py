"""A user's webhooks are theirs: another user can neither see nor delete them, and hears nothing of jobs not
theirs (a staff hook on a cluster hears that cluster's jobs; a user's cannot be made one)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from orchestrator.models import Job, Webhook, WebhookDelivery
from orchestrator.webhooks import outbox
from tests import factories

pytestmark = pytest.mark.django_db


def api(user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.force_authenticate(user)
    return client


def hook(owner, **fields) -> Webhook:  # type: ignore[no-untyped-def]
    # Made as rows: registering resolves the URL's name, and this machine resolves no public one.
    return Webhook.objects.create(owner=owner, url="https://hooks.example.com/x", events=["succeeded"], **fields)


def test_another_user_cannot_see_or_delete_a_hook(alice, bob):
    alices = hook(alice)

    assert api(bob).get("/api/webhooks/").json()["results"] == []
    assert api(bob).get(f"/api/webhooks/{alices.pk}/").status_code == 404
    assert api(bob).delete(f"/api/webhooks/{alices.pk}/").status_code == 404
    assert Webhook.objects.get(pk=alices.pk).active
    assert [h["id"] for h in api(alice).get("/api/webhooks/").json()["results"]] == [alices.pk]
    assert not {"secret", "secret_sealed"} & set(api(alice).get(f"/api/webhooks/{alices.pk}/").json())  # shown once


def test_a_hook_hears_only_its_owners_jobs_or_as_staff_its_cluster(alice, bob, django_user_model):
    staff = django_user_model.objects.create_user("carol", password="pw-carol-123", is_staff=True)
    lab = factories.cluster()
    alices, bobs = hook(alice), hook(bob)
    on_lab = hook(staff, cluster=lab)
    on_lab_by_bob = hook(bob, cluster=lab)  # a row a user could not register: still hears nothing
    job = Job.objects.create(owner=alice, cluster=lab, name="j", strategy="mirrored", program_kind="script",
                             state="running", attempt=1)  # fmt: skip

    Job.objects.filter(pk=job.pk).update(state="succeeded")
    outbox.fan_out()

    heard = set(WebhookDelivery.objects.values_list("webhook_id", flat=True))
    assert heard == {alices.pk, on_lab.pk}
    assert bobs.pk not in heard and on_lab_by_bob.pk not in heard
