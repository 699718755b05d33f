"""Sign-in limits per account and per client, on every sign-in path (the login page, the admin login and POST
/api/token/, which `tfdash login` calls), and which address counts as the client's.

Per account: a guesser with many addresses (a botnet, a block of IPv6 networks) gets at most
TFDASH_LOGIN_ACCOUNT_MAX_FAILURES (20) tries per account per TFDASH_LOGIN_LOCKOUT_S, however many addresses it has;
one client alone can never lock an account (its own limit, 5, comes first). Per client: failures for any accounts
count together. X-Forwarded-For counts only through TFDASH_NUM_PROXIES trusted proxies (default 0: never).
Each test uses accounts and addresses of its own: counts live in the shared cache (Redis) for minutes.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def _user(django_user_model, name: str):  # type: ignore[no-untyped-def]
    return django_user_model.objects.create_user(name, password=f"pw-{name}-123")


def test_an_account_is_locked_after_failures_from_many_addresses_on_every_sign_in_path(django_user_model):
    _user(django_user_model, "carol")
    _user(django_user_model, "dave")
    limit = settings.TFDASH_LOGIN_ACCOUNT_MAX_FAILURES
    assert limit > settings.TFDASH_LOGIN_MAX_FAILURES  # one client alone can never lock an account
    wrong = {"username": "carol", "password": "wrong"}
    # One failure per address, each far under its own limit; half through the API, half through the login page.
    for i in range(limit):
        address = f"10.20.{i}.1"
        if i % 2:
            assert APIClient().post("/api/token/", wrong, REMOTE_ADDR=address).status_code == 400
        else:
            assert Client().post("/accounts/login/", wrong, REMOTE_ADDR=address).status_code == 200

    right = {"username": "carol", "password": "pw-carol-123"}
    # From a fresh address, even the right password is refused, with why and for how long: the CLI's sign-in...
    api = APIClient().post("/api/token/", right, REMOTE_ADDR="10.21.0.1")
    assert api.status_code == 429
    assert api.json()["detail"].startswith("Too many failed sign-in attempts for this account. Try again in")
    assert 0 < int(api["Retry-After"]) <= settings.TFDASH_LOGIN_LOCKOUT_S
    # ...the login page and the admin's.
    page = Client().post("/accounts/login/", right, REMOTE_ADDR="10.21.0.2")
    assert page.status_code == 429
    assert page.content.decode().startswith("Too many failed sign-in attempts for this account.")
    assert Client().post("/admin/login/", right, REMOTE_ADDR="10.21.0.3").status_code == 429
    # Another account, from those same addresses, signs in as usual.
    dave = {"username": "dave", "password": "pw-dave-123"}
    assert APIClient().post("/api/token/", dave, REMOTE_ADDR="10.20.1.1").status_code == 200
    assert Client().post("/accounts/login/", dave, REMOTE_ADDR="10.20.2.1").status_code == 302


def test_a_name_no_account_has_is_limited_the_same_way(django_user_model):
    """So the lock says nothing about which names are accounts."""
    wrong = {"username": "nobody-here", "password": "wrong"}
    for i in range(settings.TFDASH_LOGIN_ACCOUNT_MAX_FAILURES):
        APIClient().post("/api/token/", wrong, REMOTE_ADDR=f"10.22.{i}.1")
    answer = APIClient().post("/api/token/", wrong, REMOTE_ADDR="10.23.0.1")
    assert answer.status_code == 429
    assert answer.json()["detail"].startswith("Too many failed sign-in attempts for this account.")


def test_one_client_is_locked_across_accounts(django_user_model):
    _user(django_user_model, "erin")
    names = ["erin", "frank", "grace", "heidi", "ivan", "judy"]
    for name in names[: settings.TFDASH_LOGIN_MAX_FAILURES]:
        APIClient().post("/api/token/", {"username": name, "password": "wrong"}, REMOTE_ADDR="10.24.0.1")

    # erin's own right password, from that client, through either path: refused as the client's lock.
    right = {"username": "erin", "password": "pw-erin-123"}
    api = APIClient().post("/api/token/", right, REMOTE_ADDR="10.24.0.1")
    assert api.status_code == 429
    assert api.json()["detail"].startswith("Too many sign-in attempts from your address.")
    assert Client().post("/accounts/login/", right, REMOTE_ADDR="10.24.0.1").status_code == 429
    # erin from elsewhere: her account took only one failure.
    assert APIClient().post("/api/token/", right, REMOTE_ADDR="10.24.0.2").status_code == 200


def test_the_forwarded_for_header_counts_only_behind_a_configured_proxy(django_user_model, settings):
    _user(django_user_model, "kim")
    wrong = {"username": "kim", "password": "wrong"}
    right = {"username": "kim", "password": "pw-kim-123"}
    proxy = "10.25.0.1"

    # Default (TFDASH_NUM_PROXIES=0): the header is the client's own word and is ignored, so a guesser cannot pick a
    # fresh "address" per try. Every client reaching us through the proxy shares its address.
    assert settings.REST_FRAMEWORK["NUM_PROXIES"] == 0
    for i in range(settings.TFDASH_LOGIN_MAX_FAILURES):
        APIClient().post("/api/token/", wrong, REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR=f"198.51.100.{i}")
    assert (
        APIClient().post("/api/token/", right, REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="198.51.100.99").status_code
        == 429
    )

    # Behind one trusted proxy (TFDASH_NUM_PROXIES=1): the address that proxy appended is the client, so one guesser
    # behind it no longer locks out everyone else behind it, and a forged entry before it changes nothing.
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    proxy = "10.25.0.2"
    for _ in range(settings.TFDASH_LOGIN_MAX_FAILURES):
        APIClient().post("/api/token/", wrong, REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="203.0.113.5")
    forged = APIClient().post("/api/token/", right, REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="203.0.113.77, 203.0.113.5")
    assert forged.status_code == 429
    page = Client().post("/accounts/login/", right, REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="203.0.113.5")
    assert page.status_code == 429
    neighbour = APIClient().post("/api/token/", right, REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="203.0.113.6")
    assert neighbour.status_code == 200


@pytest.mark.parametrize("username", ["ali\x00ce", "x" * 10_000])
def test_a_name_no_account_can_have_is_refused_as_usual_not_looked_up(django_user_model, username):
    """The limits read the name before any form checks it: a NUL (which PostgreSQL refuses in a query) or an overlong
    name must get the usual refusal, not a server error."""
    body = {"username": username, "password": "wrong"}
    assert APIClient().post("/api/token/", body, REMOTE_ADDR="10.26.0.1").status_code == 400
    assert Client().post("/accounts/login/", body, REMOTE_ADDR="10.26.0.2").status_code == 200
    assert Client().post("/admin/login/", body, REMOTE_ADDR="10.26.0.3").status_code == 200
