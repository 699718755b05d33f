"""The API tokens page: a user sees their own tokens (never another user's, never a token itself after it was shown
once), makes one for a script, and revokes one, which stops it at once; another user's token cannot be revoked
there (404)."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from rest_framework.test import APIClient

from orchestrator.identity import api_tokens
from orchestrator.models import ApiToken

pytestmark = pytest.mark.django_db


def _signed_in(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def _works(token: str) -> bool:
    return APIClient().get("/api/jobs/", HTTP_AUTHORIZATION=f"Token {token}").status_code == 200


def test_a_user_sees_their_own_tokens_and_revokes_one(alice, bob):
    laptop, laptop_row = api_tokens.issue(alice, "alice's laptop")
    _bobs, bobs_row = api_tokens.issue(bob, "bob's desktop")
    page = _signed_in(alice)

    shown = page.get("/tokens/").content.decode()
    assert "alice&#x27;s laptop" in shown and laptop_row.hint in shown
    assert "bob" not in shown and laptop not in shown

    assert page.post(f"/tokens/{bobs_row.pk}/revoke/").status_code == 404
    assert ApiToken.objects.filter(pk=bobs_row.pk).exists()

    revoked = page.post(f"/tokens/{laptop_row.pk}/revoke/", follow=True)
    assert revoked.status_code == 200
    assert "Token revoked" in revoked.content.decode()
    assert "alice&#x27;s laptop" not in revoked.content.decode()
    assert not _works(laptop)


def test_a_token_made_on_the_page_is_shown_once_and_works(alice):
    page = _signed_in(alice)
    made = page.post("/tokens/", {"name": "ci on build-3"}).content.decode()
    token = re.search(r"shown this once: <code>([A-Za-z0-9_-]+)</code>", made)
    assert token is not None
    assert _works(token.group(1))
    again = page.get("/tokens/").content.decode()
    assert "ci on build-3" in again and token.group(1) not in again


def test_the_page_is_for_signed_in_users_only(alice):
    assert Client().get("/tokens/").status_code == 302
