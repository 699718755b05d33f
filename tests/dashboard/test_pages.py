"""Every page needs a login; the cluster page shows hosts with their live status."""

from __future__ import annotations

import pytest
from django.utils import timezone

from orchestrator.models import Host
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("url", ["/", "/clusters/", "/clusters/hosts/"])
def test_it_sends_anonymous_visitors_to_sign_in(client, url):
    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={url}"


def test_the_login_page_is_open(client):
    assert client.get("/accounts/login/").status_code == 200


def test_it_shows_hosts_with_live_status_to_a_signed_in_user(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("alice", password="pw-alice-123"))
    up, _ = factories.host("up-1")
    factories.host("down-1")
    Host.objects.filter(pk=up.pk).update(
        status="online", last_heartbeat=timezone.now(), cpu_count=8, memory_total_mb=32768
    )

    page = client.get("/clusters/").content.decode()
    rows = client.get("/clusters/hosts/").content.decode()

    assert 'data-host="up-1" data-status="online"' in page
    assert 'data-host="down-1" data-status="unknown"' in page
    assert "32.0 GiB" in page
    assert "no GPU · 8 CPU slots" in page
    assert 'hx-get="/clusters/hosts/"' in page  # refreshed live
    assert 'data-host="up-1" data-status="online"' in rows
    assert "admin" not in page.split("<main>")[1]  # no admin link for non-staff


def test_staff_see_the_admin_link(admin_client):
    factories.host("up-1")

    assert 'href="/admin/orchestrator/host/"' in admin_client.get("/clusters/").content.decode()


def test_it_escapes_user_text(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("alice", password="pw-alice-123"))
    cluster = factories.cluster()
    cluster.description = "<script>alert(1)</script>"
    cluster.save()

    page = client.get("/clusters/").content.decode()

    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
