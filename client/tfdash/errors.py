"""What a tfdash client call raises: a `TfdashError` subclass, never an HTTP library's own exception.

`AuthError` (no or a refused token), `NotFound` (no such object, or another user's), `Refused` (the server refused the
request; `errors` holds its field -> messages), `Unsupported` (the server has no such API), `Unreachable` (no answer,
or a server error)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class TfdashError(Exception):
    """Something the caller can act on; the message is one line meant for a person."""


class Unreachable(TfdashError):
    """The server did not answer, or answered with an error of its own (5xx)."""


class AuthError(TfdashError):
    """Not signed in, or the token or password was refused (401, 403)."""


class NotFound(TfdashError):
    """No such job, task, experiment or artifact, or it belongs to another user (404)."""


class Unsupported(TfdashError):
    """The server does not offer this API (an older or a different version)."""


class Refused(TfdashError):
    """The server refused the request (400, 409): `errors` is its field -> messages."""

    def __init__(self, message: str, errors: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.errors: dict[str, Any] = dict(errors or {})


def error_text(errors: Mapping[str, Any]) -> str:
    """A 400's field -> messages as one line: `workers: at most 256 workers, not 300; env: TF_CONFIG is reserved`."""
    parts = []
    for field, messages in errors.items():
        text = " ".join(map(str, messages)) if isinstance(messages, list) else str(messages)
        parts.append(text if field in ("non_field_errors", "detail") else f"{field}: {text}")
    return "; ".join(parts)
