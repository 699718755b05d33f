"""Real child processes for tests: started in their own process group, output captured line by line."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import psutil

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie not yet reaped counts as ended). One lookup: `pid_exists` and then
    `Process(pid)` race with the exit in between (NoSuchProcess beside a loaded CI run)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.1, what: str = "condition") -> T:
    """Poll `predicate` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}")
        time.sleep(interval)


def own_stack_env() -> dict[str, str]:
    """The environment for a bench that starts its own servers: nothing of the suite's database or broker leaks in."""
    return {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}


class ManagedProcess:
    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], cwd: Path = ROOT) -> None:
        self.name = name
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, timeout: float) -> str:
        regex = re.compile(pattern)

        def found() -> str | None:
            if self.proc.poll() is not None and not self._reader.is_alive():
                raise AssertionError(
                    f"{self.name} exited ({self.proc.returncode}) before /{pattern}/:\n{self.output()}"
                )
            with self._lock:
                return next((line for line in self.lines if regex.search(line)), None)

        try:
            return wait_until(found, timeout, what=f"/{pattern}/ in {self.name}'s output")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- {self.name} output ---\n{self.output()[-4000:]}") from None

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crash or an OOM kill would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 15) -> int:
        self.ask_to_stop()
        return self.wait_stopped(timeout)

    def ask_to_stop(self) -> None:
        """SIGTERM to the whole process group; `wait_stopped` waits for it (several asked first stop together)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)

    def wait_stopped(self, timeout: float) -> int:
        """Its exit code; SIGKILL and TimeoutExpired after `timeout`."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._reader.join(timeout=5)
