"""What the agent tests share: a recorder standing in for the supervisor's send function, and a PID check."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from contracts import broker
from contracts.protocol import TASK_EVENT, TASK_LOGS
from tests.support.processes import wait_until


class Recorder:
    """The supervisor's send function: keeps every (task name, body) in arrival order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages: list[tuple[str, dict[str, Any]]] = []

    def __call__(
        self, name: str, body: dict[str, Any], queue: str = broker.EVENTS, then: Callable[[], None] | None = None
    ) -> None:
        with self._lock:
            self.messages.append((name, body))
        if then is not None:
            then()  # published at once

    def of(self, task_id: int) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            return [(n, b) for n, b in self.messages if b["task_id"] == task_id]

    def events(self, task_id: int, kind: str | None = None) -> list[dict[str, Any]]:
        return [b for n, b in self.of(task_id) if n == TASK_EVENT and kind in (None, b["kind"])]

    def lines(self, task_id: int) -> list[tuple[int, str, str]]:
        return [tuple(line) for n, b in self.of(task_id) if n == TASK_LOGS for line in b["lines"]]

    def texts(self, task_id: int, stream: str = "stdout") -> list[str]:
        return [text for _, s, text in self.lines(task_id) if s == stream]

    def wait_for(self, task_id: int, kind: str, timeout: float = 15) -> dict[str, Any]:
        return wait_until(
            lambda: next(iter(self.events(task_id, kind)), None), timeout, interval=0.02, what=f"{kind} of {task_id}"
        )
