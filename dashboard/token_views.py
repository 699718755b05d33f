"""The API tokens page: the signed-in user's own tokens (a name, the first characters, when each was made, last used
and expires), a form that makes one (shown once, for a CI job's TFDASH_TOKEN), and a revoke button for each. The rules
are orchestrator/identity/api_tokens.py's, as for the API."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from orchestrator.identity import api_tokens


@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    created = ""
    error = ""
    name = ""
    if request.method == "POST":
        name = api_tokens.clean_name(request.POST.get("name", ""))
        try:
            created, _row = api_tokens.issue(request.user, name or "made on the API tokens page")
        except api_tokens.TooMany as exc:
            error = str(exc)
    return render(
        request,
        "dashboard/tokens.html",
        {
            "tokens": api_tokens.of(request.user),
            "created": created,
            "error": error,
            "name": name,
            "days": settings.TFDASH_API_TOKEN_DAYS,
        },
        status=409 if error else 200,
    )


@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    if not api_tokens.revoke(request.user, token_id):
        raise Http404("No such token of yours.")
    messages.info(request, "Token revoked: it no longer signs anything in.")
    return redirect("dashboard:tokens")
