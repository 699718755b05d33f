"""Real webhook receivers on loopback for the tests: one that records each POST, checks its signature and can be down;
one that answers a byte a second (SlowReceiver)."""

from __future__ import annotations

import hashlib
import hmac
import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """`start()` serves on `port`; `down()` keeps the port bound but not listening (connections are refused)."""

    def __init__(self, secret: str = "", status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.secret = secret
        self.status = status
        self.extra_headers = headers or {}
        self.received: list[dict[str, Any]] = []  # each: headers, body, payload, signature_ok
        self._lock = threading.Lock()
        self._holder: socket.socket | None = socket.socket()
        self._holder.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused
        self.port = self._holder.getsockname()[1]
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook?x=1"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                expected = "sha256=" + hmac.new(receiver.secret.encode(), body, hashlib.sha256).hexdigest()
                given = self.headers.get("X-Hub-Signature-256", "")
                with receiver._lock:
                    receiver.received.append({
                        "path": self.path, "headers": dict(self.headers), "body": body,
                        "payload": json.loads(body), "signature_ok": hmac.compare_digest(expected, given),
                    })  # fmt: skip
                self.send_response(receiver.status)
                for name, value in receiver.extra_headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        if self._holder is not None:
            self._holder.close()
            self._holder = None
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._holder is not None:
            self._holder.close()
            self._holder = None

    def payloads(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r["payload"] for r in self.received]


class SlowReceiver:
    """A receiver that reads the whole request, then answers one byte every `every_s` seconds (an answer of
    ANSWER_BYTES: 41 s at a byte a second) until the sender hangs up. Records, per connection, when it was accepted
    and when the sender closed it (monotonic clock), and the most connections it held at once for one delivery."""

    ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.connections: list[dict[str, Any]] = []  # each: accepted, closed (None while open), key
        self._open_by_key: dict[str, int] = {}
        self.most_at_once = 0  # the most connections open at once for one delivery key
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/slow"

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        record: dict[str, Any] = {"accepted": time.monotonic(), "closed": None, "key": ""}
        with self._lock:
            self.connections.append(record)
        try:
            key = self._read_request(conn)
            with self._lock:
                record["key"] = key
                self._open_by_key[key] = self._open_by_key.get(key, 0) + 1
                self.most_at_once = max(self.most_at_once, self._open_by_key[key])
            for byte in self.ANSWER:
                if self._sender_left(conn, self.every_s):
                    break
                conn.sendall(bytes([byte]))
            else:
                self._sender_left(conn, 3600)  # answered in full: wait for the sender to hang up
        except OSError:
            pass
        finally:
            with self._lock:
                record["closed"] = time.monotonic()
                if record["key"]:
                    self._open_by_key[record["key"]] -= 1
            conn.close()

    def _sender_left(self, conn: socket.socket, wait_s: float) -> bool:
        """Wait up to `wait_s` (or until stopped); whether the sender closed the connection meanwhile."""
        end = time.monotonic() + wait_s
        while (left := end - time.monotonic()) > 0 and not self._stopped.is_set():
            readable, _, _ = select.select([conn], [], [], min(left, 0.2))
            if readable and not conn.recv(1):
                return True
        return self._stopped.is_set()

    @staticmethod
    def _read_request(conn: socket.socket) -> str:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError("the sender left mid-request")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        headers = dict(
            line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ": " in line
        )  # fmt: skip
        length = int(headers.get("Content-Length", "0"))
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError("the sender left mid-body")
            body += chunk
        return headers.get("X-Tfdash-Delivery", "")

    def held_s(self) -> list[float]:
        """How long the sender held each connection it closed."""
        with self._lock:
            return [c["closed"] - c["accepted"] for c in self.connections if c["closed"] is not None]

    def stop(self) -> None:
        self._stopped.set()
        self._listener.close()
