"""API tokens: one per sign-in, each with an expiry (TFDASH_API_TOKEN_DAYS, 30 days by default), stored only as a
hash, listed and revoked by their owner (staff: revoked in the admin); `DELETE /api/tokens/current/` is what `tfdash
logout` calls (its end-to-end test: tests/client/test_logout.py). Each test signs in from an address of its own:
sign-in counts live in the shared cache for minutes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from orchestrator.identity import api_tokens
from orchestrator.models import ApiToken

pytestmark = pytest.mark.django_db

RIGHT = {"username": "alice", "password": "pw-alice-123"}


def _signed_in(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def test_each_sign_in_gets_a_token_of_its_own_that_expires_after_30_days(alice):
    before = timezone.now()
    laptop = APIClient().post("/api/token/", {**RIGHT, "name": "laptop"}, REMOTE_ADDR="10.8.1.1")
    ci = APIClient().post("/api/token/", {**RIGHT, "name": "ci"}, REMOTE_ADDR="10.8.1.1")

    assert laptop.status_code == 200 and ci.status_code == 200
    assert laptop.json()["token"] != ci.json()["token"]
    expires = ApiToken.objects.get(pk=laptop.json()["id"]).expires_at
    assert timedelta(days=30) <= expires - before <= timedelta(days=30, minutes=1)
    for answer in (laptop, ci):
        assert _signed_in(answer.json()["token"]).get("/api/jobs/").status_code == 200
    # Only the hash is kept: the database holds nothing anyone could sign in with.
    stored = list(ApiToken.objects.filter(user=alice).values_list("digest", "hint"))
    assert len(stored) == 2
    for digest, hint in stored:
        assert laptop.json()["token"] not in (digest, hint) and ci.json()["token"] not in (digest, hint)
        assert len(hint) < 12


def test_an_expired_token_is_refused_with_a_401_that_says_so(alice):
    token, row = api_tokens.issue(alice, "old laptop")
    assert _signed_in(token).get("/api/jobs/").status_code == 200
    ApiToken.objects.filter(pk=row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    refused = _signed_in(token).get("/api/jobs/")

    assert refused.status_code == 401
    assert refused["WWW-Authenticate"] == "Token"
    detail = refused.json()["detail"]
    assert detail.startswith("This token expired on ") and "tfdash login" in detail, detail


def test_the_expiry_is_a_setting(alice, settings):
    settings.TFDASH_API_TOKEN_DAYS = 2
    _token, row = api_tokens.issue(alice)
    assert timedelta(days=2) - timedelta(minutes=1) <= row.expires_at - timezone.now() <= timedelta(days=2)


def test_logout_revokes_the_token_on_the_server_and_no_other(alice):
    laptop, _ = api_tokens.issue(alice, "laptop")
    ci, _ = api_tokens.issue(alice, "ci")

    assert _signed_in(laptop).delete("/api/tokens/current/").status_code == 204

    refused = _signed_in(laptop).get("/api/jobs/")
    assert refused.status_code == 401
    assert refused.json()["detail"].startswith("Invalid token: it was revoked")
    assert _signed_in(ci).get("/api/jobs/").status_code == 200


def test_a_user_sees_only_their_own_tokens_and_revokes_one(alice, bob):
    mine, current = api_tokens.issue(alice, "laptop")
    _other, other = api_tokens.issue(alice, "ci")
    _bobs, bobs = api_tokens.issue(bob, "bob's")
    api = _signed_in(mine)

    listed = api.get("/api/tokens/").json()
    assert {row["id"]: (row["name"], row["current"]) for row in listed} == {
        current.pk: ("laptop", True),
        other.pk: ("ci", False),
    }
    assert set(listed[0]) == {"id", "name", "hint", "created_at", "expires_at", "last_used_at", "expired", "current"}
    assert api.delete(f"/api/tokens/{bobs.pk}/").status_code == 404  # not theirs: as if there were none
    assert ApiToken.objects.filter(pk=bobs.pk).exists()

    assert api.delete(f"/api/tokens/{other.pk}/").status_code == 204

    assert _signed_in(_other).get("/api/jobs/").status_code == 401
    assert [row["id"] for row in api.get("/api/tokens/").json()] == [current.pk]


def test_a_deactivated_users_token_is_refused(alice):
    token, _ = api_tokens.issue(alice)
    alice.is_active = False
    alice.save()
    assert _signed_in(token).get("/api/jobs/").status_code == 401


@pytest.mark.parametrize(
    "header",
    [
        "Token",
        "Token a b",
        "Token ünïcödé-token-ünïcödé-token",
        "Token " + "☃" * 30,
        "Token short",
        "Token " + "a" * 129,
        "Token tfu_xxxxxxxxxxxxxxxxxxxx;y",
    ],
)
def test_a_malformed_token_header_gets_a_401(alice, header):
    answer = APIClient().get("/api/jobs/", HTTP_AUTHORIZATION=header)
    assert answer.status_code == 401
    assert answer.json()["detail"] == "Malformed token header: send `Authorization: Token <token>`."


def test_a_user_holds_at_most_the_limit_and_expired_tokens_do_not_count(alice, settings):
    settings.TFDASH_MAX_API_TOKENS_PER_USER = 2
    _first, first = api_tokens.issue(alice)
    api_tokens.issue(alice)

    refused = APIClient().post("/api/token/", RIGHT, REMOTE_ADDR="10.8.2.1")
    assert refused.status_code == 409
    assert "TFDASH_MAX_API_TOKENS_PER_USER=2" in refused.json()["detail"]

    ApiToken.objects.filter(pk=first.pk).update(expires_at=timezone.now())
    assert APIClient().post("/api/token/", RIGHT, REMOTE_ADDR="10.8.2.1").status_code == 200
    assert not ApiToken.objects.filter(pk=first.pk).exists()  # dropped: it could never work again


def test_tokens_drf_issued_before_the_upgrade_keep_working_and_only_their_hash_is_kept(alice):
    """Migration 0023 carries DRF's authtoken rows over (a CLI logged in before the upgrade stays logged in), with an
    expiry, and deletes the plain keys."""
    from importlib import import_module

    from django.apps import apps

    migration = import_module("orchestrator.migrations.0023_api_token_expiry")
    old_key = "0123456789abcdef0123456789abcdef01234567"
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, user_id integer, created timestamptz)"
        )
        cursor.execute("INSERT INTO authtoken_token VALUES (%s, %s)", [old_key, alice.pk])
    with connection.schema_editor() as editor:
        migration.carry_over_drf_tokens(apps, editor)

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM authtoken_token")
        assert cursor.fetchone() == (0,)
    assert _signed_in(old_key).get("/api/jobs/").status_code == 200
    row = ApiToken.objects.get(user=alice)
    assert timedelta(days=29) < row.expires_at - timezone.now() <= timedelta(days=30)


def test_staff_revoke_a_users_token_in_the_admin_and_never_see_it(alice, django_user_model):
    token, row = api_tokens.issue(alice, "leaked")
    staff = django_user_model.objects.create_superuser("sam", password="pw-sam-123")
    admin = Client()
    admin.force_login(staff)

    listed = admin.get("/admin/orchestrator/apitoken/").content.decode()
    assert "leaked" in listed and token not in listed and row.digest not in listed
    shown = admin.get(f"/admin/orchestrator/apitoken/{row.pk}/change/").content.decode()
    assert token not in shown and row.digest not in shown
    assert admin.get("/admin/orchestrator/apitoken/add/").status_code == 403

    assert admin.post(f"/admin/orchestrator/apitoken/{row.pk}/delete/", {"post": "yes"}).status_code == 302
    assert _signed_in(token).get("/api/jobs/").status_code == 401
