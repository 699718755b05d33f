"""DEBUG's error page shows no password, not even inside a URL: the settings that carry the database's and Redis'
passwords in URLs (DATABASE_URL, REDIS_URL, CELERY_BROKER_URL, the cache's LOCATION, the Channels layer's hosts)
under names Django does not hide, a request header, and a local variable of the failing view."""

from __future__ import annotations

import pytest
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from config.error_reports import hide_url_passwords

PASSWORD = "Sw0rdf1sh-" + "x" * 8  # a made-up one, looked for in the page


@login_not_required
def failing_view(request: HttpRequest) -> HttpResponse:
    broker = f"redis://tfdash:{PASSWORD}@redis.internal:6379/0"  # a local the page lists
    raise RuntimeError(f"the broker is away ({len(broker)} characters of URL)")


urlpatterns = [path("boom/", failing_view)]

URLS_WITH_PASSWORDS = {
    "DATABASE_URL": f"postgres://tfdash:{PASSWORD}@db.internal:5432/tfdash",
    "REDIS_URL": f"redis://:{PASSWORD}@redis.internal:6379/0",
    "CELERY_BROKER_URL": f"redis://control:{PASSWORD}@redis.internal:6379/0",
    "TFDASH_AGENT_SERVER_URL": f"rediss://agent:{PASSWORD}@redis.example.com:6380/0",
    "CHANNEL_LAYERS": {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [f"redis://control:{PASSWORD}@redis.internal:6379/0"], "capacity": 1000},
        }
    },
    "TFDASH_SOME_SERVERS": (f"amqp://guest:{PASSWORD}@mq/", [{"url": f"redis://:{PASSWORD}@r2:6379/1"}]),
}


@override_settings(DEBUG=True, ROOT_URLCONF=__name__, **URLS_WITH_PASSWORDS)
def test_the_debug_error_page_shows_no_password_in_any_url() -> None:
    client = Client(raise_request_exception=False)
    response = client.get("/boom/", HTTP_X_UPSTREAM=f"http://proxy:{PASSWORD}@edge.internal/")
    page = response.content.decode()

    assert response.status_code == 500
    assert "RuntimeError" in page and "the broker is away" in page  # it is Django's debug page, with its details
    assert "redis.internal:6379" in page and "db.internal:5432" in page and "edge.internal" in page
    assert "broker" in page  # the view's local variable is listed, its password hidden
    assert PASSWORD not in page


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://:********************@h:6379/0"),
        ("postgres://u:p%40ss@db/x?sslmode=require", "postgres://u:********************@db/x?sslmode=require"),
        ("redis://:p@ss@h/0", "redis://:********************@h/0"),  # an '@' left unencoded in the password
        (
            "a redis://u:1@h1/0 and amqp://v:2@h2/",
            "a redis://u:********************@h1/0 and amqp://v:********************@h2/",
        ),
        ("postgres://postgres@127.0.0.1:5432/tfdash", "postgres://postgres@127.0.0.1:5432/tfdash"),  # no password
        ("https://example.com/a:b@c", "https://example.com/a:b@c"),  # an '@' in the path is no password
    ],
)
def test_a_urls_password_is_replaced_and_the_rest_kept(text: str, shown: str) -> None:
    assert hide_url_passwords(text) == shown
