"""Sign-in limits count an IPv6 client by its /64: one subscriber's network, in which a host picks any of 2^64
addresses at will, so counting per address would give it a fresh lock for every attempt. An IPv4 client is counted by
its address (also when it arrives written as IPv4-mapped IPv6). Each test uses networks of its own: counts live in the
shared cache for minutes."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

from orchestrator.api.signin_limit import address_key

pytestmark = pytest.mark.django_db

RIGHT = {"username": "alice", "password": "pw-alice-123"}
WRONG = {"username": "alice", "password": "wrong"}


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::/64"),
        ("2001:DB8:1:2::1", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("192.0.2.7", "192.0.2.7"),
        ("not an address", "not an address"),
        (None, "None"),  # a server that gives no REMOTE_ADDR: all such clients share one count, as before
    ],
)
def test_an_address_is_counted_by_its_ipv4_address_or_its_ipv6_64(address: str | None, key: str) -> None:
    assert address_key(address) == key


def test_the_token_endpoint_locks_a_whole_ipv6_64_and_no_other(alice):
    client = APIClient()
    # Every failure from another address of the same /64.
    for i in range(settings.TFDASH_LOGIN_MAX_FAILURES):
        assert client.post("/api/token/", WRONG, REMOTE_ADDR=f"2001:db8:70:1::{i + 1:x}").status_code == 400

    locked = client.post("/api/token/", RIGHT, REMOTE_ADDR="2001:db8:70:1:ffff:ffff:ffff:fffe")
    assert locked.status_code == 429 and int(locked["Retry-After"]) > 0
    # The next /64 is someone else.
    assert client.post("/api/token/", RIGHT, REMOTE_ADDR="2001:db8:70:2::1").status_code == 200


def test_the_login_page_locks_a_whole_ipv6_64(alice):
    for i in range(settings.TFDASH_LOGIN_MAX_FAILURES):
        assert Client().post("/accounts/login/", WRONG, REMOTE_ADDR=f"2001:db8:71:1::{i + 1:x}").status_code == 200
    locked = Client().post("/accounts/login/", RIGHT, REMOTE_ADDR="2001:db8:71:1::abcd")
    assert locked.status_code == 429
    assert Client().post("/accounts/login/", RIGHT, REMOTE_ADDR="2001:db8:71:2::abcd").status_code == 302


def test_the_token_endpoints_rate_limit_counts_a_whole_ipv6_64(alice):
    client = APIClient()
    limit = int(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["login"].split("/")[0])
    codes = [
        client.post("/api/token/", RIGHT, REMOTE_ADDR=f"2001:db8:72:1::{i + 1:x}").status_code for i in range(limit + 1)
    ]
    assert codes == [200] * limit + [429]
    assert client.post("/api/token/", RIGHT, REMOTE_ADDR="2001:db8:72:2::1").status_code == 200


def test_an_ipv4_client_written_as_mapped_ipv6_shares_its_ipv4_lock(alice):
    client = APIClient()
    for _ in range(settings.TFDASH_LOGIN_MAX_FAILURES):
        client.post("/api/token/", WRONG, REMOTE_ADDR="::ffff:10.7.40.1")
    assert client.post("/api/token/", RIGHT, REMOTE_ADDR="10.7.40.1").status_code == 429
    assert client.post("/api/token/", RIGHT, REMOTE_ADDR="10.7.40.2").status_code == 200
