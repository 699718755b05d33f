"""One webhook POST: signed like GitHub's (`X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`), sent to the
address addresses.target checked, no redirect followed, timeouts on connect and every read, at most RESPONSE_BYTES of
the answer read."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from orchestrator.webhooks import addresses

RESPONSE_BYTES = 4096
USER_AGENT = "tfdash-webhook/1"


def signature(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no HTTP answer at all (refused, timed out, not allowed)
    detail: str

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def post(
    url: str, body: bytes, headers: dict[str, str], secret: bytes, *, allow_private: bool, timeout: float
) -> Answer:
    try:
        scheme, host, port, address = addresses.target(url, allow_private=allow_private)
    except addresses.Refused as exc:
        return Answer(None, str(exc))
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection_type = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    connection = connection_type(host, port, address, timeout)
    try:
        connection.request(
            "POST",
            path,
            body=body,
            headers={
                **headers,
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                "X-Hub-Signature-256": signature(secret, body),
            },
        )
        response = connection.getresponse()
        text = response.read(RESPONSE_BYTES).decode("utf-8", errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        return Answer(None, f"{type(exc).__name__}: {exc}"[:300])
    finally:
        connection.close()
    if 300 <= response.status < 400:
        return Answer(response.status, "a redirect (not followed)")
    return Answer(response.status, text[:300])


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the checked address; the Host header still names the host."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]
