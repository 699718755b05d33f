"""A limit on failed sign-ins, per client address, shared by the login page, the admin login and POST /api/token/.

Failures are counted in Django's cache (Redis, so every web process sees the same count) through the
`user_login_failed` signal, which both `AuthenticationForm` and DRF's token serializer trigger. After
TFDASH_LOGIN_MAX_FAILURES failures within TFDASH_LOGIN_LOCKOUT_S seconds the address is refused for the rest of that
window, with a 429 that says so and for how long; a correct password does not help while it lasts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.urls import reverse
from rest_framework.throttling import BaseThrottle

_PREFIX = "signin-failures"


def client_ident(request: Any) -> str:
    # DRF's rule: X-Forwarded-For counts only through the number of trusted proxies (NUM_PROXIES), never as sent.
    return BaseThrottle().get_ident(request)


def _keys(request: Any) -> tuple[str, str]:
    ident = client_ident(request)
    return f"{_PREFIX}:count:{ident}", f"{_PREFIX}:until:{ident}"


def record_failure(request: Any) -> None:
    window = settings.TFDASH_LOGIN_LOCKOUT_S
    count_key, until_key = _keys(request)
    cache.add(count_key, 0, timeout=window)
    try:
        count = cache.incr(count_key)
    except ValueError:  # expired between add and incr
        cache.set(count_key, 1, timeout=window)
        count = 1
    if count >= settings.TFDASH_LOGIN_MAX_FAILURES:
        cache.add(until_key, time.time() + window, timeout=window)


def retry_after(request: Any) -> int | None:
    """Seconds until this client may try again, or None when it may now."""
    _count_key, until_key = _keys(request)
    until = cache.get(until_key)
    if until is None:
        return None
    return max(1, int(until - time.time() + 0.999))


def message(seconds: int) -> str:
    return f"Too many failed sign-in attempts from your address. Try again in {seconds} seconds."


@receiver(user_login_failed, dispatch_uid="tfdash-signin-limit")
def _on_login_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    if request is not None:
        record_failure(request)


class SignInLockoutThrottle(BaseThrottle):
    """For DRF views that take a password (POST /api/token/)."""

    def allow_request(self, request: Any, view: Any) -> bool:
        self._wait = retry_after(request)
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait


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
                seconds = retry_after(request)
                if seconds is not None:
                    response = HttpResponse(message(seconds), status=429, content_type="text/plain; charset=utf-8")
                    response["Retry-After"] = str(seconds)
                    return response
        return self.get_response(request)
