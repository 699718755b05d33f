"""Limits on failed sign-ins, per client and per account, shared by the login page, the admin login and POST
/api/token/ (`tfdash login`).

Per client: an IPv6 client is counted by its /64 (one subscriber's network: a host picks any address in it at will),
an IPv4 client by its address; the same key serves the rate throttle of POST /api/token/ (LoginRateThrottle). The
address is the connection's, REMOTE_ADDR; X-Forwarded-For counts only when the operator says how many proxies of
theirs stand in front (TFDASH_NUM_PROXIES, DRF's NUM_PROXIES; default 0: the header is ignored, since anyone can send
one). Behind a proxy with that setting left at 0 every client has the proxy's address, and one guesser locks out all.

Per account: failures for one account from any number of clients (a guesser with many addresses), counted by the
user's id (by the name as given when no account has it, so a lock says nothing about which accounts exist).

Failures are counted in Django's cache (Redis, so every web process sees the same count) through the
`user_login_failed` signal, which Django's `authenticate` sends for every sign-in path. After
TFDASH_LOGIN_MAX_FAILURES failures from one client, or TFDASH_LOGIN_ACCOUNT_MAX_FAILURES for one account, within
TFDASH_LOGIN_LOCKOUT_S seconds, that client (or account) is refused for the rest of that window, with a 429 that says
which and for how long; a correct password does not help while it lasts (else the lock would not stop a guesser).
Sessions and API tokens already held keep working: a locked account refuses new sign-ins only.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_login_failed
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.urls import reverse
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle, ScopedRateThrottle

_PREFIX = "signin-failures"


def client_ident(request: Any) -> str:
    # DRF's rule: X-Forwarded-For counts only through the number of trusted proxies (NUM_PROXIES), never as sent.
    return address_key(BaseThrottle().get_ident(request))


def address_key(address: str | None) -> str:
    """What a client is counted by: an IPv4 address (also one written as IPv4-mapped IPv6) itself, an IPv6 address
    its /64 network; anything that is not an address (none, from a server that gives no REMOTE_ADDR) as given."""
    if address is None:
        return "None"
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])  # a zone (fe80::1%eth0) names no other network
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(parsed) >> 64 << 64, 64)))
    return str(parsed)


def _keys(request: Any) -> tuple[str, str]:
    ident = client_ident(request)
    return f"{_PREFIX}:count:{ident}", f"{_PREFIX}:until:{ident}"


def account_ident(username: object) -> str | None:
    """What an account is counted by: its user's id; a name no account has, by a hash of that name (any length, any
    characters, and no lookup of it tells a lock on a real account from one on a made-up name). None: no name."""
    if not isinstance(username, str) or not username:
        return None
    model = get_user_model()
    field = model._meta.get_field(model.USERNAME_FIELD)
    # Read before any form checks the name: one no account can have (a NUL, which PostgreSQL refuses in a query, or
    # past the field's length) is not looked up.
    if "\x00" not in username and len(username) <= (field.max_length or len(username)):
        pk = model._default_manager.filter(**{model.USERNAME_FIELD: username}).values_list("pk", flat=True).first()
        if pk is not None:
            return f"user-{pk}"
    return "name-" + hashlib.sha256(username.encode("utf-8", "surrogatepass")).hexdigest()


def _account_keys(ident: str) -> tuple[str, str]:
    return f"{_PREFIX}:account-count:{ident}", f"{_PREFIX}:account-until:{ident}"


def record_failure(request: Any, username: object = None) -> None:
    _count(*_keys(request), settings.TFDASH_LOGIN_MAX_FAILURES)
    ident = account_ident(username)
    if ident is not None:
        _count(*_account_keys(ident), settings.TFDASH_LOGIN_ACCOUNT_MAX_FAILURES)


def _count(count_key: str, until_key: str, max_failures: int) -> None:
    window = settings.TFDASH_LOGIN_LOCKOUT_S
    cache.add(count_key, 0, timeout=window)
    try:
        count = cache.incr(count_key)
    except ValueError:  # expired between add and incr
        cache.set(count_key, 1, timeout=window)
        count = 1
    except redis.ResponseError:  # not a number: a value this module did not write; count from here
        cache.set(count_key, 1, timeout=window)
        count = 1
    if count < max_failures:
        return
    until = time.time() + window
    # add: a lock already running keeps its end; one that does not read as a time is replaced.
    if not cache.add(until_key, until, timeout=window) and _until(until_key) is None:
        cache.set(until_key, until, timeout=window)


def _until(until_key: str) -> float | None:
    """When the lock on this key ends, or None when there is none (or the value is not what record_failure wrote)."""
    until = cache.get(until_key)
    if isinstance(until, bool) or not isinstance(until, (int, float)):
        return None
    return float(until)


def retry_after(request: Any) -> int | None:
    """Seconds until this client may try again, or None when it may now."""
    _count_key, until_key = _keys(request)
    return _seconds_left(until_key)


def account_retry_after(username: object) -> int | None:
    """Seconds until anyone may try to sign in to this account again, or None when they may now."""
    ident = account_ident(username)
    if ident is None:
        return None
    _count_key, until_key = _account_keys(ident)
    return _seconds_left(until_key)


def _seconds_left(until_key: str) -> int | None:
    until = _until(until_key)
    if until is None:
        return None
    return max(1, int(until - time.time() + 0.999))


def message(seconds: int) -> str:
    return f"Too many failed sign-in attempts from your address. Try again in {seconds} seconds."


def account_message(seconds: int) -> str:
    return (
        f"Too many failed sign-in attempts for this account. Try again in {seconds} seconds; if that was not you, "
        "tell your administrator."
    )


def refusal(request: Any, username: object) -> tuple[int, str] | None:
    """(seconds, message) when a sign-in by this client to this account must be refused now, else None."""
    seconds = retry_after(request)
    if seconds is not None:
        return seconds, message(seconds)
    seconds = account_retry_after(username)
    if seconds is not None:
        return seconds, account_message(seconds)
    return None


@receiver(user_login_failed, dispatch_uid="tfdash-signin-limit")
def _on_login_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    if request is not None:
        record_failure(request, credentials.get(get_user_model().USERNAME_FIELD))


class SignInLockoutThrottle(BaseThrottle):
    """For DRF views that take a password (POST /api/token/): the client's lock, then the account's."""

    def allow_request(self, request: Any, view: Any) -> bool:
        self._wait = retry_after(request)
        if self._wait is not None:
            return False
        data = request.data
        seconds = account_retry_after(data.get("username") if hasattr(data, "get") else None)
        if seconds is not None:
            raise exceptions.Throttled(wait=seconds, detail=account_message(seconds))
        return True

    def wait(self) -> float | None:
        return self._wait


class _ThrottleHistory:
    """DRF's throttle history in the cache, where a value that is not a list of times (one this module did not
    write) reads as no history rather than failing every request of that client."""

    def get(self, key: str, default: Any = None) -> Any:
        value = cache.get(key)
        if isinstance(value, list) and all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in value):
            return value
        return default

    def set(self, key: str, value: Any, timeout: float | None = None) -> None:
        cache.set(key, value, timeout)


class LoginRateThrottle(ScopedRateThrottle):
    """DRF's scoped rate throttle (scope "login"), keyed like the lockout: an IPv6 client by its /64."""

    cache = _ThrottleHistory()

    def get_ident(self, request: Any) -> str:
        return client_ident(request)


class SignInLimitMiddleware:
    """Answers a sign-in POST to the login pages with 429 while the client's address is locked out."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self._paths: set[str] | None = None

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.method == "POST":
            if self._paths is None:
                self._paths = {reverse(settings.LOGIN_URL), reverse("admin:login")}
            if request.path in self._paths:
                refused = refusal(request, request.POST.get("username"))
                if refused is not None:
                    seconds, text = refused
                    response = HttpResponse(text, status=429, content_type="text/plain; charset=utf-8")
                    response["Retry-After"] = str(seconds)
                    return response
        return self.get_response(request)
