"""A task's output: two readers (stdout, stderr) number its lines into one sequence, and a flusher sends them in
batches (TASK_LOGS) and keeps a tail."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import IO, Any

from contracts import broker
from contracts.limits import MAX_LOG_LINE_CHARS
from contracts.protocol import TASK_LOGS, TaskLogBatch

log = logging.getLogger(__name__)

SendFn = Callable[[str, dict[str, Any]], None]
LogLine = tuple[int, str, str]  # (seq, stream, text)

MAX_LINE_BYTES = 4 * MAX_LOG_LINE_CHARS  # UTF-8: at most 4 bytes a character, so a capped line always fits one read
BATCH_LINES = 200
BATCH_CHARS = 1_000_000  # keeps one Redis message reasonable even when every line is at the cap
BATCH_AGE_S = 0.5
TAIL_LINES = 200


class TaskLogs:
    """One task attempt's output: numbered lines, batched to TASK_LOGS, with a tail kept for debugging."""

    def __init__(self, task_id: int, attempt: int, send: SendFn) -> None:
        self.task_id = task_id
        self.attempt = attempt
        self._send = send
        self._cond = threading.Condition()
        self._pending: list[LogLine] = []
        self._first_at = 0.0
        self._next_seq = 0
        self._closed = False
        # Held while a batch is handed to the outbox, so batches leave in seq order whoever flushes them.
        self._send_lock = threading.Lock()
        self.tail: deque[LogLine] = deque(maxlen=TAIL_LINES)

    def add(self, stream: str, text: str) -> None:
        with self._cond:
            line = (self._next_seq, stream, text)
            self._next_seq += 1
            if not self._pending:
                self._first_at = time.monotonic()
                self._cond.notify_all()  # starts the flusher's 0.5 s clock
            self._pending.append(line)
            self.tail.append(line)
            if len(self._pending) >= BATCH_LINES:
                self._cond.notify_all()

    def run_flusher(self) -> None:
        while self._wait_for_batch():
            self.flush()

    def _wait_for_batch(self) -> bool:
        """True when a batch is due (200 lines, or the oldest unsent line is 0.5 s old); False once closed."""
        with self._cond:
            while not self._closed:
                if len(self._pending) >= BATCH_LINES:
                    return True
                if not self._pending:
                    self._cond.wait()
                    continue
                left = self._first_at + BATCH_AGE_S - time.monotonic()
                if left <= 0:
                    return True
                self._cond.wait(left)
            return False

    def flush(self) -> None:
        with self._send_lock:
            with self._cond:
                lines, self._pending = self._pending, []
            for chunk in _chunks(lines):
                batch = TaskLogBatch(task_id=self.task_id, attempt=self.attempt, lines=chunk)
                # On the metrics stream, not a Celery queue: a stream entry stays pending until the ingest
                # acknowledges it, so no consumer crash or Redis restart can lose a line in delivery.
                self._send(TASK_LOGS, asdict(batch), queue=broker.METRICS)

    def tail_lines(self) -> list[LogLine]:
        with self._cond:
            return list(self.tail)

    def close(self) -> None:
        """Stop the flusher; the caller flushes what is left."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def read_lines(stream: IO[bytes], name: str, logs: TaskLogs) -> None:
    """Number and hand on one stream's lines until it closes."""
    try:
        while raw := stream.readline(MAX_LINE_BYTES):
            if len(raw) >= MAX_LINE_BYTES and not raw.endswith(b"\n"):
                _skip_rest_of_line(stream)  # keep the capped head, drop the rest of a giant line
            logs.add(name, _decode_line(raw))
    except (OSError, ValueError) as exc:  # the pipe was closed under us
        log.debug("reader %s stopped: %s", name, exc)
    finally:
        stream.close()


def _skip_rest_of_line(stream: IO[bytes]) -> None:
    while chunk := stream.readline(MAX_LINE_BYTES):
        if chunk.endswith(b"\n"):
            return


def _decode_line(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    if text.endswith("\n"):
        text = text[:-1]
    if text.endswith("\r"):
        text = text[:-1]
    return text[:MAX_LOG_LINE_CHARS]


def _chunks(lines: list[LogLine]) -> list[list[LogLine]]:
    chunks: list[list[LogLine]] = []
    current: list[LogLine] = []
    size = 0
    for line in lines:
        if current and (len(current) >= BATCH_LINES or size + len(line[2]) > BATCH_CHARS):
            chunks.append(current)
            current, size = [], 0
        current.append(line)
        size += len(line[2])
    if current:
        chunks.append(current)
    return chunks
