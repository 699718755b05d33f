"""GET /metrics: Prometheus' text format, for staff signed in or a scraper with the token TFDASH_METRICS_TOKEN
(`Authorization: Bearer <token>`; none set: staff only)."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from orchestrator.monitoring.collector import TfdashCollector

# A scrape token is printable ASCII (RFC 6750's b64token is a subset); anything longer than this is not one.
TOKEN_MAX = 1024


def _allowed(request: HttpRequest) -> bool:
    if request.user.is_authenticated and request.user.is_staff:
        return True
    expected = settings.TFDASH_METRICS_TOKEN
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    given = given.strip()
    if not expected or scheme.lower() != "bearer" or not _well_formed(given):
        return False
    # Bytes, not str: compare_digest raises on a str with non-ASCII characters, which answered 500 to any scraper
    # (or anyone) sending one. Both are ASCII here, so their bytes are the same text.
    return hmac.compare_digest(given.encode("ascii"), expected.encode("utf-8"))


def _well_formed(token: str) -> bool:
    return 0 < len(token) <= TOKEN_MAX and token.isascii() and token.isprintable() and " " not in token


@login_not_required  # a scraper has no session: the token or a staff session is checked here
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        response = HttpResponse("staff or the scrape token only\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="tfdash metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TfdashCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
