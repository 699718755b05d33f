"""The metrics pipe of one task attempt: the TF process writes JSON lines to it, the agent forwards them.

The supervisor creates the pipe, passes the write end to the child (env METRICS_FD_ENV) and closes its own copy, so
the read end sees EOF once the child and every process that inherited the fd are gone. One daemon thread per task
reads it: the "metric" and "facts" objects of one read are batched into one TASK_METRICS and handed on at once (no
flush timer: the outbox batches further whatever waits while it publishes), "artifact" objects become TASK_ARTIFACT
with the file's content; both go to the host's METRICS stream, consumed in order apart from the lifecycle events (see
protocol.py). The child runs arbitrary user code, so nothing it writes may hurt the agent: over-long lines, non-JSON,
unknown kinds and bad artifacts are dropped with a counted, rate-limited warning, and the reader keeps draining the
pipe whatever happens (a reader that stopped reading would block the child once the pipe buffer fills). What it
may publish is bounded (publish_budget.py: metric-line bytes, artifacts and their bytes per attempt): past that, lines
and artifacts are dropped before they are read, counted, and the counts ride in its next report (`dropped`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from contracts import broker
from contracts.limits import MAX_ARTIFACT_BYTES
from contracts.metric_messages import TaskArtifact, TaskMetricsBatch
from contracts.names import artifact_name_problem
from contracts.protocol import TASK_ARTIFACT, TASK_METRICS
from contracts.store import ARTIFACT_SLOTS, MAX_STORE_ARTIFACT_BYTES
from worker_agent.folders import Outside, Roots, open_file, read_fd
from worker_agent.supervision.publish_budget import PipeBudget
from worker_agent.supervision.store_http import ArtifactSlots, StoreError, http_put

log = logging.getLogger(__name__)

# `send(task_name, body, queue=...)`: the outbox's send (or a test's recorder with the same signature).
SendFn = Callable[..., None]

MAX_METRIC_LINE_BYTES = 64 * 1024
BATCH_EVENTS = 500
READ_CHUNK = 64 * 1024
WARN_EVERY_S = 10.0
STOP_JOIN_S = 2.0  # after a stop the reader only flushes what it holds: this is a safety net, not a wait
UPLOAD_WAIT_S = 900.0  # an artifact upload under way when the task ends: how long its exit may wait for it
EVENT_KINDS = frozenset({"metric", "facts"})


class MetricsPipe:
    """One task attempt's pipe and its reader. Lifecycle: create, pass `write_fd` to Popen, `child_started()`,
    `start()`, and at the child's exit `finish(timeout)`; `discard()` instead when the child never started."""

    def __init__(
        self,
        task_id: int,
        attempt: int,
        send: SendFn,
        owner: int | None = None,
        artifacts_from: Roots | None = None,
        store_slots: ArtifactSlots | None = None,
    ) -> None:
        self.task_id = task_id
        self.attempt = attempt
        self._send = send
        # The agent (root) reads an artifact only from the job's own folders (`artifacts_from`), reached without
        # following a link, and only a file the task's uid owns (`owner`, with --task-uids): or a script could name
        # the agent's token file or another job's checkpoint and have it uploaded.
        self.owner = owner
        self.artifacts_from = artifacts_from
        # On a cluster with an object store: artifacts go there (presigned PUTs), not through the broker.
        self.store_slots = store_slots
        # os.pipe() fds are non-inheritable: only the child gets the write end (Popen's pass_fds), no sibling task.
        self._read_fd, self.write_fd = os.pipe()
        # Closing the wake pipe's write end tells a reader blocked in poll() to stop: no fd is closed under a thread
        # that might still use it (an fd number closed elsewhere can be reused by anything).
        self._wake_r, self._wake_w = os.pipe()
        # Every fd is closed exactly once (a second close could hit an unrelated fd that reused the number).
        self._open_fds = {self.write_fd, self._read_fd, self._wake_r, self._wake_w}
        self._fd_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending: list[dict[str, Any]] = []
        # Held while handing a message on, so nothing goes out once `finish` has closed the stream (EXITED is last).
        self._send_lock = threading.Lock()
        # Held while an artifact is read and handed on, or uploaded to the object store: `finish` waits for it.
        self._upload_lock = threading.Lock()
        self._closed = False
        self.dropped = 0
        self._unwarned = 0
        self._last_reason = ""
        self._last_warned_at = -WARN_EVERY_S
        self.sent_events = 0
        self.sent_artifacts = 0
        # What this attempt may publish, and what it had dropped for it (contracts/publish_limits.py).
        self.budget = PipeBudget()

    @property
    def label(self) -> str:
        return f"task {self.task_id} attempt {self.attempt}"

    # --- lifecycle (supervisor side) ------------------------------------------------------------------------------
    def child_started(self) -> None:
        """Close the parent's copy of the write end, so EOF arrives when the child's processes are gone."""
        self._close(self.write_fd)

    def start(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=f"metrics-{name}", daemon=True)
        self._thread.start()

    def discard(self) -> None:
        """The child never started: close everything, read nothing."""
        for fd in (self.write_fd, self._read_fd, self._wake_r, self._wake_w):
            self._close(fd)

    def finish(self, timeout: float) -> None:
        """Wait (at most `timeout`) for EOF and the reader's last flush; after that nothing more is sent.

        Called once the task's process group is dead, so EOF is normally immediate; only a process that escaped the
        group (setsid) while holding the fd keeps the pipe open, and then the reader is told to stop.
        """
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            while thread.is_alive() and self._upload_lock.locked():
                # An artifact being read or uploaded: it, and the lines written after it, go before the exit. Each
                # wait is bounded, and so is their number: the task's artifact budget admits only so many.
                if not self._upload_lock.acquire(timeout=UPLOAD_WAIT_S):
                    break
                self._upload_lock.release()
                thread.join(timeout)
            if thread.is_alive():
                log.warning(
                    "%s: metrics pipe still open %.1f s after the exit (a process outside its group holds it): "
                    "no longer reading it",
                    self.label,
                    timeout,
                )
        self._close(self._wake_w)  # wakes the reader if still running: it flushes what it holds and returns
        if thread is not None:
            thread.join(STOP_JOIN_S)
        with self._send_lock:
            self._closed = True
        self._warn_dropped(final=True)
        if thread is None:  # never started: nobody else closes the reader's fds
            self._close(self._read_fd)
            self._close(self._wake_r)

    # --- the reader thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        buffer = bytearray()
        skipping = False  # inside an over-long line: drop bytes until its newline
        try:
            while True:
                ready = {fd for fd, _ in poller.poll()}
                if self._wake_r in ready:
                    break  # told to stop: keep what was read whole, forget a partial line
                if self._read_fd in ready:
                    chunk = os.read(self._read_fd, READ_CHUNK)
                    if not chunk:  # EOF: every writer is gone; a last line without a newline still counts
                        if buffer and not skipping:
                            self._line(bytes(buffer))
                        break
                    buffer += chunk
                    skipping = self._split(buffer, skipping)
                if self._pending or self.budget.unreported:
                    self._flush()
        except Exception:  # never expected (os.read on our own pipe); the thread must end quietly, fds closed
            log.exception("%s: metrics reader failed", self.label)
        finally:
            try:
                self._flush()
            finally:
                # The read end closes only here, on the thread that polls it; a writer still holding the pipe then
                # gets EPIPE instead of blocking forever on a full buffer.
                self._close(self._read_fd)
                self._close(self._wake_r)

    def _close(self, fd: int) -> None:
        with self._fd_lock:
            if fd not in self._open_fds:
                return
            self._open_fds.discard(fd)
        os.close(fd)

    def _split(self, buffer: bytearray, skipping: bool) -> bool:
        """Handle every complete line in `buffer` (removing it); returns whether an over-long line continues."""
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            if skipping:
                skipping = False  # the rest of the over-long line ends here; it was counted when it began
            elif end - start > MAX_METRIC_LINE_BYTES:
                self._drop(f"line longer than {MAX_METRIC_LINE_BYTES} bytes")
            elif self.budget.line(end - start + 1):  # past its rate a line is dropped unread (counted, reported)
                self._line(bytes(buffer[start:end]))
            start = end + 1
        del buffer[:start]
        if len(buffer) > MAX_METRIC_LINE_BYTES:
            if not skipping:
                self._drop(f"line longer than {MAX_METRIC_LINE_BYTES} bytes")
            buffer.clear()  # a giant line never sits in memory: its bytes are dropped as they arrive
            return True
        return skipping

    def _line(self, raw: bytes) -> None:
        try:
            self._handle(raw)
        except Exception as exc:  # whatever the child wrote, the reader goes on
            self._drop(f"could not handle the line: {exc!r}"[:200])

    def _handle(self, raw: bytes) -> None:
        if not raw.strip():
            return  # a blank line is harmless: not worth a warning
        try:
            # Strict JSON: NaN, Infinity and 1e999 would pass Python's parser, then break a strict consumer downstream.
            obj = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite_float)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            self._drop(f"not JSON ({type(exc).__name__})")
            return
        if not isinstance(obj, dict):
            self._drop(f"a JSON {type(obj).__name__}, not an object")
            return
        kind = obj.get("kind")
        if kind in EVENT_KINDS:
            self._pending.append(obj)
        elif kind == "artifact":
            self._artifact(obj)
        else:
            self._drop(f"unknown kind {str(kind)[:50]!r}")

    def _flush(self) -> None:
        events, self._pending = self._pending, []
        # Every report carries the running totals of what was dropped (the page and API say so); a drop with no
        # points to ride on goes in a report of its own, at most one per read of the pipe.
        dropped = dict(self.budget.dropped) or None
        if not events and self.budget.unreported:
            if self._emit(TASK_METRICS, asdict(TaskMetricsBatch(self.task_id, self.attempt, [], dropped=dropped))):
                self.budget.unreported = False
            return
        for start in range(0, len(events), BATCH_EVENTS):
            chunk = events[start : start + BATCH_EVENTS]
            batch = TaskMetricsBatch(self.task_id, self.attempt, chunk, dropped=dropped)
            if self._emit(TASK_METRICS, asdict(batch)):
                self.sent_events += len(chunk)
                self.budget.unreported = False

    # --- artifacts ------------------------------------------------------------------------------------------------
    def _artifact(self, obj: dict[str, Any]) -> None:
        name, path = obj.get("name"), obj.get("path")
        problem = artifact_name_problem(name)
        if problem:
            self._drop(f"artifact {str(name)[:100]!r}: {problem}")
            return
        if self.store_slots:
            self._flush()
            self._artifact_to_store(name, path)
            return
        with self._upload_lock:
            self._artifact_inline(name, path)

    def _artifact_inline(self, name: str, path: Any) -> None:
        content = self._read_within_budget(name, path)
        if content is None:
            return
        # Read inline: a local regular file of at most MAX_ARTIFACT_BYTES; meanwhile the child's writes wait in the
        # pipe buffer, which is what they would do anyway while the agent is busy.
        self._flush()  # metrics written before the artifact line go out first
        artifact = TaskArtifact(
            task_id=self.task_id,
            attempt=self.attempt,
            name=name,
            sha256=hashlib.sha256(content).hexdigest(),
            content_b64=base64.b64encode(content).decode("ascii"),
        )
        if self._emit(TASK_ARTIFACT, asdict(artifact)):
            self.sent_artifacts += 1
            log.info("%s: artifact %r (%d bytes) handed on", self.label, name, len(content))

    def _read_within_budget(self, name: str, path: Any) -> bytes | None:
        """The artifact's content when the task may still send one of its size (taken from the fd: a file over the
        task's budget is never read), else None (dropped and counted)."""
        fd = open_artifact(path, self.artifacts_from, self.owner, MAX_ARTIFACT_BYTES)
        content: bytes | str
        try:
            if isinstance(fd, str):
                content = fd
            elif (over := self.budget.artifact(os.fstat(fd).st_size)) is not None:
                content = over
            else:
                content = read_fd(fd, MAX_ARTIFACT_BYTES)
        finally:
            if not isinstance(fd, str):
                os.close(fd)
        if isinstance(content, str):
            self._drop(f"artifact {name!r} ({str(path)[:300]!r}): {content}")
            return None
        return content

    def _artifact_to_store(self, name: str, path: Any) -> None:
        """Upload the file to the task attempt's next artifact slot (read by fd, as `open_artifact` checks), then
        hand on its name, slot, size and SHA-256 (hashed while sent): the control plane checks the stored size."""
        assert self.store_slots is not None
        with self._upload_lock:
            self._upload_to_store(name, path)

    def _upload_to_store(self, name: str, path: Any) -> None:
        assert self.store_slots is not None
        fd = open_artifact(path, self.artifacts_from, self.owner, MAX_STORE_ARTIFACT_BYTES)
        if isinstance(fd, str):
            self._drop(f"artifact {name!r} ({str(path)[:300]!r}): {fd}")
            return
        with os.fdopen(fd, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            taken = self.store_slots.take()
            if taken is None:
                self._drop(f"artifact {name!r}: this task attempt used all its {ARTIFACT_SLOTS} artifact slots")
                return
            slot, url = taken
            try:
                digest = http_put(url, handle, size)
            except StoreError as exc:
                self._drop(f"artifact {name!r}: upload failed: {exc}")
                return
        artifact = TaskArtifact(self.task_id, self.attempt, name, digest, "", size=size, slot=slot)
        if self._emit(TASK_ARTIFACT, asdict(artifact)):
            self.sent_artifacts += 1
            log.info("%s: artifact %r (%d bytes) uploaded to the store, slot %d", self.label, name, size, slot)

    # --- sending and warning --------------------------------------------------------------------------------------
    def _emit(self, task_name: str, body: dict[str, Any]) -> bool:
        with self._send_lock:
            if self._closed:  # EXITED may already be out: a late message would contradict it
                log.warning("%s: dropping a late %s after the exit", self.label, task_name)
                return False
            try:
                self._send(task_name, body, queue=broker.METRICS)
            except Exception:  # the outbox never raises; an injected sender might, and must not end the reader
                log.exception("%s: could not hand on %s", self.label, task_name)
                return False
            return True

    def _drop(self, reason: str) -> None:
        self.dropped += 1
        self._unwarned += 1
        self._last_reason = reason
        self._warn_dropped(final=False)

    def _warn_dropped(self, *, final: bool) -> None:
        """At most one warning every WARN_EVERY_S per task (a garbage-writing child must not flood the agent's log),
        plus one at the end for what was counted since."""
        now = time.monotonic()
        if not self._unwarned or (not final and now - self._last_warned_at < WARN_EVERY_S):
            return
        log.warning(
            "%s: dropped %d metrics line(s) (%d in all); the latest: %s",
            self.label,
            self._unwarned,
            self.dropped,
            self._last_reason,
        )
        self._unwarned = 0
        self._last_warned_at = now


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is not a finite number")
    return value


def open_artifact(path: Any, artifacts_from: Roots | None, owner: int | None, max_bytes: int) -> int | str:
    """An fd of the regular file at `path`, below one of `artifacts_from` (owned by `owner` when given), or why it
    cannot be sent. Checked before it is opened and after, never through a link (folders.open_file)."""
    if not isinstance(path, str) or not os.path.isabs(path):
        return "the path must be an absolute path"
    if artifacts_from is None:
        return "this task has no folder to send artifacts from"
    try:
        place = artifacts_from.place(path)
    except Outside as exc:
        return f"not in the job's folders: {exc}"
    return open_file(place, owner=owner, max_bytes=max_bytes)
