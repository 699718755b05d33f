"""One webhook POST: signed like GitHub's (`X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`), sent to the
address addresses.target checked, no redirect followed, at most RESPONSE_BYTES of the answer read, and the whole of
it (name lookup, connect, TLS, send, read) within one deadline.

Why a deadline and not timeouts: a socket timeout bounds each read, so a receiver answering a byte a second never
trips it and held a thread for as long as it liked. Here the socket's timeout is the time left, and a timer shuts the
socket down at the deadline, which ends any read, write or TLS handshake blocked on it (from another thread, as
`shutdown` may); the exchange then fails and the answer says the deadline passed."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import socket
import ssl
import threading
import time
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
    url: str, body: bytes, headers: dict[str, str], secret: bytes, *, allow_private: bool, deadline_s: float
) -> Answer:
    """POST `body` to `url`; whatever the receiver does, this returns within `deadline_s` (name lookup aside: it
    cannot be interrupted, and what it took counts against the deadline)."""
    cut = _Cut(time.monotonic() + deadline_s, deadline_s)
    try:
        scheme, host, port, address = addresses.target(url, allow_private=allow_private)
    except addresses.Refused as exc:
        return Answer(None, str(exc))
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection_type = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    connection = connection_type(host, port, address, cut)
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
    except (OSError, http.client.HTTPException, ValueError) as exc:
        # ValueError: http.client reading from a socket the cut closed under it.
        if cut.fired or cut.left() <= 0:
            return Answer(None, cut.message())
        return Answer(None, f"{type(exc).__name__}: {exc}"[:300])
    finally:
        cut.cancel()
        connection.close()
    if 300 <= response.status < 400:
        return Answer(response.status, "a redirect (not followed)")
    return Answer(response.status, text[:300])


class _Cut:
    """Shuts a connection's socket down when the deadline passes."""

    def __init__(self, deadline: float, deadline_s: float) -> None:
        self.deadline = deadline
        self.deadline_s = deadline_s
        self.fired = False
        self._sock: socket.socket | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def message(self) -> str:
        return f"no complete answer within the {self.deadline_s:g} s deadline (connect, send and read together)"

    def arm(self, sock: socket.socket) -> None:
        """Watch `sock`'s connection through a duplicate of its descriptor: wrapping it in TLS detaches the plain
        socket object, and a shutdown acts on the connection, whichever descriptor names it (a TLS read ends too)."""
        left = self.left()
        if left <= 0:
            raise TimeoutError(self.message())
        with self._lock:
            self._sock = sock.dup()
            self._timer = threading.Timer(left, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._sock is not None:
                # OSError: already closed by the other side: nothing left to end.
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            if self._sock is not None:
                self._sock.close()
            self._sock = None

    def connect(self, address: str, port: int) -> socket.socket:
        left = self.left()
        if left <= 0:
            raise TimeoutError(self.message())
        sock = socket.create_connection((address, port), timeout=left)
        try:
            self.arm(sock)
        except BaseException:
            sock.close()
            raise
        return sock


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the checked address within the deadline; the Host header still names the host."""

    def __init__(self, host: str, port: int, address: str, cut: _Cut) -> None:
        super().__init__(host, port, timeout=max(cut.left(), 0.001))
        self.address = address
        self.cut = cut

    def connect(self) -> None:
        self.sock = self.cut.connect(self.address, self.port)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, cut: _Cut) -> None:
        super().__init__(host, port, timeout=max(cut.left(), 0.001), context=ssl.create_default_context())
        self.address = address
        self.cut = cut

    def connect(self) -> None:
        sock = self.cut.connect(self.address, self.port)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]
