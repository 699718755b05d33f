"""A TCP relay to a real server, on a port of its own, that can be closed and opened: a process given its address
meets the server away (connection refused) until the test opens it, then talks to the real one through it."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpRelay:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        with socket.socket() as probe:  # a port nothing listens on until `open`
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name="relay-accept", daemon=True).start()

    def close(self) -> None:
        with self._lock:
            every = [*self._sockets, *([self._listener] if self._listener else [])]
            self._sockets, self._listener = [], None
        for each in every:
            with contextlib.suppress(OSError):
                each.shutdown(socket.SHUT_RDWR)
            each.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _address = listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pipe, args=(source, sink), name="relay-pipe", daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
