"""Sign-in limits (login page, admin, POST /api/token/), CSRF on pages, secrets only from the environment.

The WebSocket origin check has its test beside the consumer: tests/dashboard/test_job_socket.py
(`test_anonymous_visitors_and_other_users_are_refused`, the cross-site connect).
Each test signs in from an address of its own: failure counts live in the shared cache (Redis) for minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def test_it_locks_the_token_endpoint_after_repeated_wrong_passwords(alice):
    client = APIClient()
    wrong = {"username": "alice", "password": "wrong"}
    for _ in range(settings.TFDASH_LOGIN_MAX_FAILURES):
        assert client.post("/api/token/", wrong, REMOTE_ADDR="10.7.0.1").status_code == 400

    # Even the right password is refused while the lock lasts, with how long it lasts.
    locked = client.post("/api/token/", {"username": "alice", "password": "pw-alice-123"}, REMOTE_ADDR="10.7.0.1")
    assert locked.status_code == 429
    assert locked.json()["detail"].startswith("Too many sign-in attempts from your address. Expected available in")
    assert 0 < int(locked["Retry-After"]) <= settings.TFDASH_LOGIN_LOCKOUT_S
    # Another address is not affected.
    other = client.post("/api/token/", {"username": "alice", "password": "pw-alice-123"}, REMOTE_ADDR="10.7.0.2")
    assert other.status_code == 200 and other.json()["token"]


def test_a_forged_forwarded_for_header_does_not_escape_the_lock(alice):
    client = APIClient()
    for i in range(settings.TFDASH_LOGIN_MAX_FAILURES + 1):
        response = client.post(
            "/api/token/",
            {"username": "alice", "password": "wrong"},
            REMOTE_ADDR="10.7.1.1",
            HTTP_X_FORWARDED_FOR=f"192.0.2.{i}",
        )
    assert response.status_code == 429


def test_the_token_endpoint_is_rate_limited_even_for_right_passwords(alice):
    client = APIClient()
    limit = int(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["login"].split("/")[0])
    right = {"username": "alice", "password": "pw-alice-123"}
    codes = [client.post("/api/token/", right, REMOTE_ADDR="10.7.2.1").status_code for _ in range(limit + 1)]
    assert codes == [200] * limit + [429]


def test_it_locks_the_login_page_after_repeated_wrong_passwords(alice):
    client = Client()
    wrong = {"username": "alice", "password": "wrong"}
    for _ in range(settings.TFDASH_LOGIN_MAX_FAILURES):
        response = client.post("/accounts/login/", wrong, REMOTE_ADDR="10.7.3.1")
        assert response.status_code == 200  # the form again, with its error
        assert b"Please enter a correct username and password" in response.content

    locked = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice-123"}, REMOTE_ADDR="10.7.3.1")
    assert locked.status_code == 429
    assert locked.content.decode().startswith("Too many failed sign-in attempts from your address. Try again in")
    assert int(locked["Retry-After"]) > 0
    # The same lock covers the admin login.
    admin = client.post("/admin/login/", {"username": "alice", "password": "pw-alice-123"}, REMOTE_ADDR="10.7.3.1")
    assert admin.status_code == 429
    # Someone else, elsewhere, signs in as usual.
    ok = Client().post("/accounts/login/", {"username": "alice", "password": "pw-alice-123"}, REMOTE_ADDR="10.7.3.2")
    assert ok.status_code == 302


def test_pages_refuse_a_post_without_a_csrf_token(alice):
    client = Client(enforce_csrf_checks=True)
    login = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice-123"}, REMOTE_ADDR="10.7.4.1")
    assert login.status_code == 403

    client.force_login(alice)
    assert client.post("/jobs/new/", {"name": "x"}).status_code == 403
    assert client.post("/jobs/1/cancel/").status_code == 403


def test_the_api_wants_a_csrf_token_with_a_session_but_not_with_a_token(alice):
    session = APIClient(enforce_csrf_checks=True)
    session.login(username="alice", password="pw-alice-123")
    response = session.post("/api/jobs/plan/", {}, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]

    from orchestrator.identity import api_tokens

    token = APIClient(enforce_csrf_checks=True)
    token.credentials(HTTP_AUTHORIZATION=f"Token {api_tokens.issue(alice)[0]}")
    assert token.post("/api/jobs/plan/", {}, format="json").status_code == 400  # past CSRF, to validation


def _settings_in_a_fresh_process(env: dict[str, str], expr: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", f"import config.settings as s; print({expr})"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip


def test_secrets_come_only_from_the_environment():
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG", "DJANGO_SETTINGS_MODULE")}
    result = _settings_in_a_fresh_process(env, "s.DEBUG")
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr

    # Not even DEBUG brings a built-in key: sessions signed with a known key could be forged.
    result = _settings_in_a_fresh_process({**env, "DEBUG": "1"}, "s.DEBUG")
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr

    result = _settings_in_a_fresh_process({**env, "SECRET_KEY": "from-the-environment"}, "s.SECRET_KEY, s.DEBUG")
    assert result.stdout.split() == ["from-the-environment", "False"], result.stderr


def test_https_deployments_get_secure_cookies_and_hsts():
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "TFDASH_HTTPS")}
    expr = "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, s.SECURE_SSL_REDIRECT"
    result = _settings_in_a_fresh_process({**env, "TFDASH_HTTPS": "1"}, expr)
    assert result.stdout.split() == ["True", "True", "31536000", "True"], result.stderr
    # Plain HTTP on loopback (make run, the tests): cookies must still work without TLS.
    result = _settings_in_a_fresh_process(env, "getattr(s, 'SESSION_COOKIE_SECURE', False), s.SESSION_COOKIE_HTTPONLY")
    assert result.stdout.split() == ["False", "True"], result.stderr
