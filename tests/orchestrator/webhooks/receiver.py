"""A real webhook receiver on loopback for the tests: records each POST, checks its signature, can be down."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
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
