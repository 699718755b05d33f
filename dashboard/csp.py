"""A Content-Security-Policy on every response: the browser runs only scripts served by this site from files, never
inline code, event-handler attributes or `eval`; loads nothing from elsewhere; and the site is never framed.

So even markup that slipped through escaping could not run: the pages carry no inline script (data for a script goes
in a `json_script` block, which is data, or a `data-` attribute) and no inline style. `connect-src` names the site's
own WebSocket origin besides 'self': CSP Level 3 lets 'self' match ws:/wss: of the same host, but older browsers
(Safari before 15.4) do not, and the job page lives on its socket. `img-src` also allows `data:` images (the pages'
empty favicon). The DRF browsable API's own templates set a few styles inline, so its HTML pages, and only those, may
use inline styles (never scripts).
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponseBase
from rest_framework.renderers import BrowsableAPIRenderer

HEADER = "Content-Security-Policy"

POLICY = (
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "object-src 'none'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
    "form-action 'self'",
)


def policy(request: HttpRequest, response: HttpResponseBase) -> str:
    directives = list(POLICY)
    try:
        host = request.get_host()  # checked against ALLOWED_HOSTS, so it holds no ';' or space
    except DisallowedHost:
        directives.append("connect-src 'self'")
    else:
        directives.append(f"connect-src 'self' {'wss' if request.is_secure() else 'ws'}://{host}")
    if isinstance(getattr(response, "accepted_renderer", None), BrowsableAPIRenderer):
        directives[directives.index("style-src 'self'")] = "style-src 'self' 'unsafe-inline'"
    return "; ".join(directives)


class ContentSecurityPolicyMiddleware:
    """Outermost, so that every response gets it: pages, redirects, the API, refusals made by other middleware."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        if HEADER not in response:
            response[HEADER] = policy(request, response)
        return response
