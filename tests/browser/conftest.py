"""Real-browser fixtures: Debian's Chromium driven by Playwright's sync API, against a real Daphne process.

Playwright's sync API keeps an asyncio loop running on the test's thread for as long as it is started, and Django
refuses synchronous database work on a thread with a running loop (SynchronousOnlyOperation). So:
- database work during a test goes through `orm`, one helper thread. DJANGO_ALLOW_ASYNC_UNSAFE would also silence
  the check, but for the whole test process, real mistakes included; a thread keeps the check and costs nothing;
- the browser is started per test, after the test's database fixture, so it is stopped before pytest-django empties
  the tables on the test's own thread.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.db import connections

from tests.support.ports import free_port
from tests.support.processes import ManagedProcess, wait_until

T = TypeVar("T")

CHROMIUM = os.environ.get("TFDASH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


class Orm:
    """Runs database work on one helper thread (see the module's docstring)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orm")

    def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._pool.submit(fn, *args, **kwargs).result(timeout=60)

    def close(self) -> None:
        self._pool.submit(connections.close_all).result(timeout=60)
        self._pool.shutdown()


@pytest.fixture
def orm(transactional_db: None) -> Iterator[Orm]:
    helper = Orm()
    yield helper
    helper.close()


class WebServer:
    """`python -m daphne` on a fixed port, as in production; `kill()` + `start()` is a real server restart."""

    def __init__(self, env: dict[str, str], port: int) -> None:
        self.env = env
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: ManagedProcess | None = None
        self.logs: list[str] = []

    def start(self) -> None:
        argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"]
        self.proc = ManagedProcess(f"web:{self.port}", argv, self.env)
        wait_until(self._accepts, timeout=30, interval=0.05, what=f"daphne listening on {self.port}")

    def _accepts(self) -> bool:
        assert self.proc is not None
        if self.proc.proc.poll() is not None:
            raise AssertionError(f"daphne exited ({self.proc.proc.returncode}):\n{self.proc.output()[-4000:]}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL, as a crash would: every open socket drops at once, nothing is closed politely."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.stop()
        self.logs.append(self.proc.output())
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.kill()


@pytest.fixture
def web(
    service_env: dict[str, str], transactional_db: None, artifacts_dir: Path, request: pytest.FixtureRequest
) -> Iterator[WebServer]:
    # tests.settings: config.settings plus the fast test password hasher, so users made in the test can sign in.
    server = WebServer({**service_env, "DJANGO_SETTINGS_MODULE": "tests.settings"}, free_port())
    server.start()
    yield server
    server.stop()
    (artifacts_dir / f"web-{request.node.name}.log").write_text("\n--- killed, started again ---\n".join(server.logs))


@pytest.fixture
def browser(transactional_db: None) -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (CI does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
