"""What DEBUG's error page (and the error e-mails) may show: no password, not even inside a URL.

Django's SafeExceptionReporterFilter hides a setting only by its name (API, TOKEN, KEY, SECRET, PASS, SIGNATURE), but
here the passwords of PostgreSQL and Redis travel inside URLs (DATABASE_URL, REDIS_URL, CELERY_BROKER_URL, the
cache's LOCATION, the Channels layer's hosts), under names that say none of that. This filter also replaces the
password of any `scheme://user:password@host` in a setting, a request header or a frame's local variable, however
deep in dicts, lists and tuples.
"""

from __future__ import annotations

import re
from typing import Any

from django.views.debug import SafeExceptionReporterFilter

# The authority of a URL: what follows `scheme://` up to the path, query or fragment (RFC 3986).
_MAX_DEPTH = 20
_URL = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<authority>[^/?#\s]*)")


def hide_url_passwords(text: str, substitute: str = SafeExceptionReporterFilter.cleansed_substitute) -> str:
    """`text` with the password of every URL in it replaced (`redis://:pw@h/0` -> `redis://:*****@h/0`)."""

    def hide(match: re.Match[str]) -> str:
        userinfo, at, host = match["authority"].rpartition("@")
        if not at or ":" not in userinfo:
            return match[0]
        user = userinfo.split(":", 1)[0]
        return f"{match['scheme']}{user}:{substitute}@{host}"

    return _URL.sub(hide, text)


class SecretURLFilter(SafeExceptionReporterFilter):
    def cleanse_setting(self, key: Any, value: Any) -> Any:
        # Django's own recursion (dicts, lists, tuples) calls back here for every item, so strings at any depth pass.
        cleansed = super().cleanse_setting(key, value)
        return self._hide(cleansed) if isinstance(cleansed, str) else cleansed

    def cleanse_special_types(self, request: Any, value: Any) -> Any:
        return self._hide(super().cleanse_special_types(request, value))

    def _hide(self, value: Any, depth: int = 0) -> Any:
        if isinstance(value, str):
            return hide_url_passwords(value, self.cleansed_substitute)
        if type(value) not in (dict, list, tuple):
            return value
        if depth > _MAX_DEPTH:  # a structure that deep (or one that holds itself) is not shown at all
            return self.cleansed_substitute
        if type(value) is dict:
            return {k: self._hide(v, depth + 1) for k, v in value.items()}
        return type(value)(self._hide(v, depth + 1) for v in value)
