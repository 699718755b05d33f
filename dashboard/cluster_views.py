"""The clusters page: each cluster's hosts (status, slots, load), a page of them per table, live through htmx; for the
staff, how far the metrics ingest is behind."""

from __future__ import annotations

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from dashboard import page_data
from orchestrator.metrics import stream as metrics_stream
from orchestrator.plumbing import counters


@require_GET
def clusters(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "dashboard/clusters.html",
        {
            "clusters": page_data.cluster_rows(page=_page(request)),
            "heartbeat_timeout": settings.TFDASH_HEARTBEAT_TIMEOUT_S,
            "page": _page(request),
            "ingest_behind_s": _ingest_behind_s() if request.user.is_staff else None,
        },
    )


def _ingest_behind_s() -> float | None:
    """For the staff: how long the oldest unstored metric entry has waited, when the ingest is behind; else None."""
    try:
        waiting = metrics_stream.waiting_age_s(counters.client())
    except redis.RedisError:
        return None  # the page shows what it can; /metrics says Redis could not be read
    return waiting if metrics_stream.behind(waiting) else None


def _page(request: HttpRequest) -> int:
    """The hosts page asked for (page_data.HOSTS_PER_PAGE hosts per cluster table); 1 when none or not a number."""
    try:
        return max(1, int(request.GET.get("page", "1")))
    except ValueError:
        return 1


@require_GET
def host_rows(request: HttpRequest) -> HttpResponse:
    """The host tables alone: htmx swaps them in every few seconds so statuses, slots and load stay live."""
    return render(request, "dashboard/_host_tables.html", {"clusters": page_data.cluster_rows(page=_page(request))})
