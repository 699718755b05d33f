"""`Authorization: Token <token>` for the REST API: the users' API tokens (orchestrator/identity/api_tokens.py), each
with an expiry, in place of DRF's authtoken (one token per user, forever, stored in plain text).

Every refusal is a 401 with a message that says what to do: a malformed header, a token that was never issued or was
revoked, an expired one (with when it expired), or one whose user was deactivated.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication

from orchestrator.identity import api_tokens
from orchestrator.models import ApiToken

KEYWORD = "Token"
SIGN_IN_AGAIN = "Sign in again (`tfdash login URL`, or POST /api/token/) for a new token."


def header_token(request: Any) -> str | None:
    """The token of an `Authorization: Token ...` header; None when the header names another scheme or there is none.
    AuthenticationFailed when it names this scheme but is not one well-formed token."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if isinstance(header, bytes):  # a WSGI server may hand it over undecoded: HTTP headers are Latin-1
        header = header.decode("latin-1")
    parts = header.split()
    if not parts or parts[0].lower() != KEYWORD.lower():
        return None
    if len(parts) != 2 or not api_tokens.WELL_FORMED.fullmatch(parts[1]):
        raise exceptions.AuthenticationFailed(f"Malformed token header: send `Authorization: {KEYWORD} <token>`.")
    return parts[1]


class ApiTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Any) -> tuple[Any, ApiToken] | None:
        token = header_token(request)
        if token is None:
            return None
        row = api_tokens.find(token)
        if row is None:
            raise exceptions.AuthenticationFailed(f"Invalid token: it was revoked or never issued. {SIGN_IN_AGAIN}")
        if row.expires_at <= timezone.now():
            when = row.expires_at.strftime("%Y-%m-%d %H:%M UTC")
            raise exceptions.AuthenticationFailed(f"This token expired on {when}. {SIGN_IN_AGAIN}")
        if not row.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        api_tokens.touch(row)
        return row.user, row

    def authenticate_header(self, request: Any) -> str:
        # A WWW-Authenticate header makes DRF answer 401 (not 403) to a request without valid credentials.
        return KEYWORD


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """The schema's name for this scheme (`tokenAuth`, `Authorization: Token ...`), as DRF's TokenAuthentication had:
    defining it registers it with drf-spectacular."""

    target_class = ApiTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return dict(build_bearer_security_scheme_object(header_name="Authorization", token_prefix=KEYWORD))
