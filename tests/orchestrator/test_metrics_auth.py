"""`GET /metrics` answers 401, never an error, to any Authorization header that is not the scrape token: non-ASCII
(which made `hmac.compare_digest` raise, a 500), empty, overlong, another scheme, control characters, several
words. The right token still gets the scrape (so each refusal is the check's, not a broken endpoint)."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

TOKEN = "s3cret-scrape-token"


@pytest.mark.parametrize(
    "header",
    [
        "Bearer s3cret-scrape-tökén",  # Latin-1: what a server decodes any header byte to
        "Bearer ☃",  # beyond Latin-1
        "Bearer " + TOKEN + "é",
        "Bearer",
        "Bearer ",
        "Bearer " + TOKEN + "x" * 10_000,  # overlong, starting with the right token
        "Basic " + TOKEN,
        "Token " + TOKEN,
        TOKEN,
        "Bearer " + TOKEN + " extra",
        "Bearer " + TOKEN + "\x00",
        "Bearer \t" + TOKEN + "\x7f",
        "",
    ],
)
def test_a_malformed_or_wrong_token_gets_401(header: str, settings) -> None:
    settings.TFDASH_METRICS_TOKEN = TOKEN
    answer = Client().get("/metrics", HTTP_AUTHORIZATION=header)
    assert answer.status_code == 401
    assert answer["WWW-Authenticate"] == 'Bearer realm="tfdash metrics"'


def test_a_non_ascii_token_gets_401_also_when_no_scrape_token_is_set(settings) -> None:
    settings.TFDASH_METRICS_TOKEN = ""
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer tökén").status_code == 401


def test_the_right_token_still_scrapes(settings) -> None:
    settings.TFDASH_METRICS_TOKEN = TOKEN
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer " + TOKEN).status_code == 200
    assert Client().get("/metrics", HTTP_AUTHORIZATION="bearer  " + TOKEN + " ").status_code == 200
