"""A task's output, files first (the kubelet/containerd model).

A task's stdout and stderr are two files of the agent's (`<workdir>/output/<task>-<attempt>.stdout|.stderr`, mode
0600 in a folder only the agent may enter), opened by the agent and handed to the process as its fds 1 and 2: the task
writes to a file, never to a pipe, so an agent that dies cannot break its output (no SIGPIPE, no lost line), and the
task cannot reach the files by name (no rename, no link swapped in for the agent to follow).

The agent tails both files from a position (an offset per file and the next line number) that it persists beside
them (`.pos`, written atomically) once the lines up to it are published: a restarted agent carries on from there, so a
line is sent at least once and, numbered the same each time, stored once (the ingest keys lines by task and seq).
What was read and published is punched out of the files (FALLOC_FL_PUNCH_HOLE), so on disk they hold only what is not
yet sent. The files go once the task's last line is published.

A long line of progress-bar redraws is folded as it grows, its last state exact (output_lines.py).

Bounded (contracts/publish_limits.py, publish_budget.py): past its output rate, a task's whole lines are read and
dropped unnumbered, and a numbered line "lines dropped: N" stands where they went (at most one a second while it
lasts, and one when the task ends), so the log says what is missing and the line count its exit carries still holds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from contracts import broker
from contracts.limits import MAX_LOG_LINE_CHARS
from contracts.protocol import TASK_LOGS
from contracts.publish_limits import lines_dropped_text
from contracts.task_messages import TaskLogBatch
from worker_agent import atomic
from worker_agent.supervision.output_holes import punch
from worker_agent.supervision.output_lines import carry_after, fold_at, line_text
from worker_agent.supervision.output_position import Position
from worker_agent.supervision.publish_budget import OutputBudget

log = logging.getLogger(__name__)

SendFn = Callable[..., None]  # send(name, body, queue=..., then=...): `then` runs once the message is published
LogLine = tuple[int, str, str]  # (seq, stream, text)

STREAMS = ("stdout", "stderr")
MAX_LINE_BYTES = 4 * MAX_LOG_LINE_CHARS  # UTF-8: at most 4 bytes a character, so a capped line always fits one read
READ_BYTES = 1 << 20
BATCH_LINES = 200
BATCH_CHARS = 1_000_000  # keeps one Redis message reasonable even when every line is at the cap
BATCH_AGE_S = 0.5
TAIL_LINES = 200
TAIL_POLL_S = 0.1  # how often a live task's files are looked at (a stat and a read: cheap)
# While a task's output is over its rate, one "lines dropped: N" line at most this often (and one when it ends).
DROPPED_NOTE_S = 1.0


class OutputFiles:
    """The `<workdir>/output/` folder: a task attempt's two output files and its persisted position."""

    def __init__(self, workdir: Path) -> None:
        self.folder = Path(workdir) / "output"

    def path(self, task_id: int, attempt: int, suffix: str) -> Path:
        return self.folder / f"{task_id}-{attempt}.{suffix}"

    def create(self, task_id: int, attempt: int) -> dict[str, int]:
        """Fresh, empty files for a task attempt (an earlier try of the same launch's files truncated); returns the
        write fds (append-only) to hand to the process as stdout and stderr. The caller closes them."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        self.path(task_id, attempt, "pos").unlink(missing_ok=True)
        fds: dict[str, int] = {}
        try:
            for stream in STREAMS:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
                fds[stream] = os.open(self.path(task_id, attempt, stream), flags, 0o600)
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            raise
        return fds

    def load_position(self, task_id: int, attempt: int) -> Position:
        try:
            raw = json.loads(self.path(task_id, attempt, "pos").read_text())
            position = Position(**raw)
            if not all(isinstance(position.offset(s), int) and position.offset(s) >= 0 for s in STREAMS):
                raise ValueError(f"bad offsets {raw}")
            if not isinstance(position.seq, int) or position.seq < 0:
                raise ValueError(f"bad seq {raw}")
            if not all(isinstance(getattr(position, f"carry_{s}"), str) for s in STREAMS):
                raise ValueError("bad carry")
            return position
        except FileNotFoundError:
            return Position()
        except (OSError, ValueError, TypeError) as exc:
            # Reading again from the start costs duplicates the ingest drops (same seqs), never a lost line.
            log.warning("task %s attempt %s: unreadable output position (%r): reading from the start", task_id,
                        attempt, exc)  # fmt: skip
            return Position()

    def save_position(self, task_id: int, attempt: int, position: Position) -> None:
        atomic.write_json(self.path(task_id, attempt, "pos"), asdict(position))

    def remove(self, task_id: int, attempt: int) -> None:
        for suffix in (*STREAMS, "pos"):
            with contextlib.suppress(OSError):
                self.path(task_id, attempt, suffix).unlink(missing_ok=True)

    def leftovers(self) -> list[tuple[int, int]]:
        """(task_id, attempt) of every task attempt whose output is still here (not all published)."""
        if not self.folder.is_dir():
            return []
        found = set()
        for path in self.folder.iterdir():
            name, _, suffix = path.name.partition(".")
            task, _, attempt = name.partition("-")
            if suffix in (*STREAMS, "pos") and task.isdigit() and attempt.isdigit():
                found.add((int(task), int(attempt)))
        return sorted(found)


class TaskLogs:
    """One task attempt's output: tailed from its files, numbered, batched to TASK_LOGS, a tail kept for debugging."""

    def __init__(self, task_id: int, attempt: int, send: SendFn, files: OutputFiles) -> None:
        self.task_id = task_id
        self.attempt = attempt
        self._send = send
        self.files = files
        self._cond = threading.Condition()
        self._pending: list[tuple[LogLine, Position]] = []  # each line with the position right after it
        self._first_at = 0.0
        self._position = files.load_position(task_id, attempt)  # what has been read (numbered) so far
        self._closed = False
        self._ended = threading.Event()  # the process is gone: read to the end, then stop tailing
        self._readers: dict[str, int] = {}
        # Held while a batch is handed to the outbox, so batches leave in seq order whoever flushes them.
        self._send_lock = threading.Lock()
        self._in_flight = 0  # batches handed to the outbox and not yet published
        self._finishing = False  # the task is over and all its output read: the files go after the last batch
        self.tail: deque[LogLine] = deque(maxlen=TAIL_LINES)
        self.budget = OutputBudget()
        self._noted_at = -DROPPED_NOTE_S  # when the latest "lines dropped" line was numbered

    @property
    def lines(self) -> int:
        """How many lines the task has printed so far that the agent has read (the next line's number)."""
        with self._cond:
            return self._position.seq

    # --- reading --------------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Open the files to read (before the process may write, or after a restart); a missing file reads empty."""
        for stream in STREAMS:
            try:
                self._readers[stream] = os.open(
                    self.files.path(self.task_id, self.attempt, stream), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                )
            except FileNotFoundError:
                continue
            except OSError as exc:  # a link (O_NOFOLLOW), or worse: never followed, never the agent's end
                log.warning("task %s attempt %s: cannot read its %s: %s", self.task_id, self.attempt, stream, exc)

    def run_tailer(self) -> None:
        """Read new lines every TAIL_POLL_S until `end()`, then read to the end once more (a last line without a
        newline included) and close the files."""
        try:
            while not self._ended.wait(TAIL_POLL_S):
                self.read_available(final=False)
            self.read_available(final=True)
        finally:
            self._close_readers()

    def end(self) -> None:
        """The task's processes are all gone: nothing more will be written."""
        self._ended.set()

    def read_available(self, *, final: bool) -> None:
        for stream in STREAMS:
            fd = self._readers.get(stream)
            if fd is not None:
                self._read_stream(stream, fd, final=final)
        if final:
            with self._cond:
                self._note_dropped(STREAMS[0], force=True)

    def _read_stream(self, stream: str, fd: int, *, final: bool) -> None:
        while True:
            with self._cond:
                offset, skipping = self._position.offset(stream), self._position.skipping(stream)
            data = os.pread(fd, READ_BYTES, offset)
            if not data:
                return
            used = self._take_lines(stream, data, offset, skipping, final=final)
            if used == 0:
                return  # only a partial line so far: wait for its end

    def _take_lines(self, stream: str, data: bytes, offset: int, skipping: bool, *, final: bool) -> int:
        """Number the complete lines in `data` (read at `offset`); returns the bytes used."""
        used = 0
        while used < len(data):
            end = data.find(b"\n", used)
            cut = -1 if skipping else fold_at(data, used, len(data) if end < 0 else end)
            if cut >= 0 and self._fold(stream, data[used:cut], offset + cut):
                used = cut  # read on from the line's last \r: its rest is short, or long enough for a head cut
                continue
            if end < 0:
                rest = len(data) - used
                if rest >= MAX_LINE_BYTES and not skipping:
                    # A giant line: keep its capped head, skip the rest up to its newline.
                    self._add(stream, data[used : used + MAX_LINE_BYTES], offset + used + rest, skipping=True)
                    return len(data)
                if skipping and rest:
                    self._advance(stream, offset + len(data), skipping=True)
                    return len(data)
                if final and rest:
                    self._add(stream, data[used:], offset + len(data), skipping=False)
                    return len(data)
                return used
            line = data[used : end + 1]
            if skipping:
                self._advance(stream, offset + end + 1, skipping=False)
                skipping = False
            else:
                self._add(stream, line[:MAX_LINE_BYTES], offset + end + 1, skipping=False)
            used = end + 1
        return used

    def _advance(self, stream: str, offset: int, *, skipping: bool) -> None:
        with self._cond:
            self._position = replace(self._position, **{stream: offset, f"skipping_{stream}": skipping})

    def _fold(self, stream: str, part: bytes, offset: int) -> bool:
        """Fold `part` (an unfinished line up to its last \r, read up to `offset`) into the stream's carry."""
        with self._cond:
            carry = carry_after(self._position.carry(stream), part)
            if carry is not None:
                moved: dict[str, Any] = {stream: offset, f"carry_{stream}": carry}
                self._position = replace(self._position, **moved)
            return carry is not None

    def _add(self, stream: str, raw: bytes, offset: int, *, skipping: bool) -> None:
        with self._cond:
            moved: dict[str, Any] = {stream: offset, f"skipping_{stream}": skipping, f"carry_{stream}": ""}
            if not self.budget.admit(len(raw)):  # over the task's output rate: read past, not numbered
                self._position = replace(self._position, **moved)
                return
            self._note_dropped(stream, force=False)
            self._number(stream, line_text(self._position.carry(stream), raw), **moved)

    def _note_dropped(self, stream: str, *, force: bool) -> None:
        """Number a "lines dropped: N" line for the lines dropped since the last one (called holding the lock)."""
        now = time.monotonic()
        if self.budget.gap and (force or now - self._noted_at >= DROPPED_NOTE_S):
            self._noted_at = now
            self._number(stream, lines_dropped_text(self.budget.take_gap()))

    def _number(self, stream: str, text: str, **moved: object) -> None:
        """Give `text` the next number and queue it; `moved`: how the position moves with it (called holding the
        lock)."""
        line = (self._position.seq, stream, text)
        self._position = replace(self._position, seq=self._position.seq + 1, **moved)  # type: ignore[arg-type]
        if not self._pending:
            self._first_at = time.monotonic()
            self._cond.notify_all()  # starts the flusher's 0.5 s clock
        self._pending.append((line, self._position))
        self.tail.append(line)
        if len(self._pending) >= BATCH_LINES:
            self._cond.notify_all()

    def discard(self) -> None:
        """The process never started: the files opened for it are closed."""
        self._close_readers()

    def _close_readers(self) -> None:
        for fd in self._readers.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._readers.clear()

    # --- sending --------------------------------------------------------------------------------------------------
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

    def flush(self, *, last: bool = False) -> None:
        """Hand what is pending to the outbox; each batch's position is persisted once it is published. `last`: the
        task is over and everything is read: the files go once the final batch is published."""
        with self._send_lock:
            with self._cond:
                pending, self._pending = self._pending, []
            chunks = _chunks(pending)
            for i, chunk in enumerate(chunks):
                lines = [line for line, _ in chunk]
                batch = TaskLogBatch(self.task_id, self.attempt, lines, dropped=self.budget.dropped)
                with self._cond:
                    self._in_flight += 1
                    self._finishing = last and i == len(chunks) - 1
                # On the metrics stream, not a Celery queue: a stream entry stays pending until the ingest
                # acknowledges it, so no consumer crash or Redis restart can lose a line in delivery.
                self._send(TASK_LOGS, asdict(batch), queue=broker.METRICS, then=self._on_published(chunk[-1][1]))
            if last and not chunks:
                with self._cond:
                    self._finishing = True
                    done = self._in_flight == 0
                if done:  # else the last batch in flight removes them once published
                    self.files.remove(self.task_id, self.attempt)

    def _on_published(self, position: Position) -> Callable[[], None]:
        def published() -> None:
            with self._cond:
                self._in_flight -= 1
                done = self._finishing and self._in_flight == 0
            self._published_upto(position, last=done)

        return published

    def _published_upto(self, position: Position, *, last: bool) -> None:
        """Runs on the outbox's thread once a batch is published (in order): persist, and free the disk behind;
        after the task's last batch, the files go."""
        try:
            if last:
                self.files.remove(self.task_id, self.attempt)
                return
            self.files.save_position(self.task_id, self.attempt, position)
            for stream in STREAMS:
                punch(self.files.path(self.task_id, self.attempt, stream), position.offset(stream))
        except OSError as exc:  # costs duplicates (dropped by the ingest) after a restart, never a line
            log.warning("task %s attempt %s: could not persist the output position: %s", self.task_id,
                        self.attempt, exc)  # fmt: skip

    def tail_lines(self) -> list[LogLine]:
        with self._cond:
            return list(self.tail)

    def close(self) -> None:
        """Stop the flusher; the caller flushes what is left."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def drain(self) -> int:
        """Read everything there is (the task is over) and send it, the files removed once published; returns the
        task's line count. For output a previous agent left: no threads."""
        self.open()
        try:
            self.read_available(final=True)
        finally:
            self._close_readers()
        self.flush(last=True)
        return self.lines


def _chunks(lines: list[tuple[LogLine, Position]]) -> list[list[tuple[LogLine, Position]]]:
    chunks: list[list[tuple[LogLine, Position]]] = []
    current: list[tuple[LogLine, Position]] = []
    size = 0
    for item in lines:
        if current and (len(current) >= BATCH_LINES or size + len(item[0][2]) > BATCH_CHARS):
            chunks.append(current)
            current, size = [], 0
        current.append(item)
        size += len(item[0][2])
    if current:
        chunks.append(current)
    return chunks
