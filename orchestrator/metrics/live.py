"""Pushing live frames to the browsers watching a job: one function (`send`), so every publisher goes through here
(dashboard/access.py's word to a session's or a user's sockets too).

What travels on a job's group: metric batches ("metrics", never one point each), host samples ("hosts"), a task's
facts ("facts"), and two hints that carry no data: "job.changed" (the job or one of its tasks changed state) and
"logs.stored" (lines of one of its tasks were stored). Each socket answers a hint by reading the rows itself
(dashboard/consumers.py), so a hint lost or doubled costs nothing: the next one, or a reconnect, reads the truth.
Hints go out after the transaction that made the change commits, at most one of each kind per job and transaction:
a placement or a gang restart saves the job and many tasks, and the channel layer drops what a socket has not read
past its capacity, so a burst of identical hints would only crowd out metric frames.

A failure to publish never breaks the caller: the rows are stored, and a page that missed a frame catches up when it
reconnects.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any

from channels.layers import get_channel_layer
from django.db import transaction

from orchestrator.plumbing import after_commit

log = logging.getLogger(__name__)

JOB_CHANGED = "job.changed"
LOGS_STORED = "logs.stored"


def group_name(job_id: int) -> str:
    return f"job-{job_id}"


PUBLISH_TIMEOUT_S = 2.0

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _publisher_loop() -> asyncio.AbstractEventLoop:
    """One long-lived event loop per process for publishing: the channel layer keeps its Redis connections per loop,
    so a fresh loop per frame (async_to_sync) would reconnect every time (measured: 3.3 ms a frame)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="live-publisher", daemon=True).start()
            _loop = loop
        return _loop


def send(messages: list[tuple[str, dict[str, Any]]], wait_s: float | None) -> None:
    """The one place anything is sent to the pages' sockets: each (group, message) on this process's publisher loop,
    all concurrently. Waited for up to `wait_s` seconds, so what one caller sends leaves in the order it sent it; with
    `wait_s` None not waited for (hints: no order holds between them). A failure is logged, never raised: the rows are
    stored, and a page that missed a frame catches up when it reconnects."""
    layer = get_channel_layer()
    if layer is None or not messages:
        return

    async def send_all() -> list[BaseException]:
        sends = [layer.group_send(group, message) for group, message in messages]
        return [r for r in await asyncio.gather(*sends, return_exceptions=True) if isinstance(r, BaseException)]

    future = asyncio.run_coroutine_threadsafe(send_all(), _publisher_loop())
    if wait_s is None:
        future.add_done_callback(lambda done: _log_failed(messages, done.result()))
        return
    try:
        failed = future.result(timeout=wait_s)
    except Exception as exc:  # Redis down or slow
        future.cancel()
        failed = [exc]
    _log_failed(messages, failed)


def _log_failed(messages: list[tuple[str, dict[str, Any]]], failed: list[BaseException]) -> None:
    if failed:
        group, message = messages[0]
        kind = message.get("frame", message).get("type")
        log.warning(
            "could not send %d of %d messages (a %s to %s first): %r",
            len(failed),
            len(messages),
            kind,
            group,
            failed[0],
        )


def _frames(frames: list[tuple[int, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    # The consumer's handler is `live_frame` (Channels maps "live.frame" to it).
    return [(group_name(job_id), {"type": "live.frame", "frame": frame}) for job_id, frame in frames]


def publish(job_id: int, frame: dict[str, Any]) -> None:
    """One frame to the job's pages, waited for, so frames of one job leave in the order they were stored (pages drop
    ids below their cursor)."""
    send(_frames([(job_id, frame)]), PUBLISH_TIMEOUT_S)


def publish_each(frames: list[tuple[int, dict[str, Any]]]) -> None:
    """`publish` for frames of different jobs (at most one per job: the ingest's points of a batch), sent concurrently
    and waited for together, so the next batch's frames still leave after these (measured: 500 jobs' frames one by one
    were a quarter of the ingest's time at fleet size)."""
    send(_frames(frames), PUBLISH_TIMEOUT_S * 5)


def publish_many(frames: list[tuple[int, dict[str, Any]]]) -> None:
    """Hints for many jobs at once (a scheduler pass starting 150 jobs), sent concurrently and not waited for: a hint
    carries no data, so no order holds between them, and the pass that sends them need not wait out the round trips.
    A failure is logged when the sends finish."""
    send(_frames(frames), None)


def jobs_changed(job_ids: list[int]) -> None:
    """`job_changed` for many jobs, their hints sent together once the current transaction commits."""
    ids = list(job_ids)
    if ids:
        transaction.on_commit(lambda: publish_many([(job_id, {"type": JOB_CHANGED}) for job_id in ids]))


def job_changed(job_id: int, using: str | None = None) -> None:
    """Tell the job's pages, once the current transaction (on database `using`) commits, that its state or its tasks
    changed."""
    after_commit.once(_Hint(job_id, JOB_CHANGED), using)


def logs_stored(job_id: int, using: str | None = None) -> None:
    """Tell the job's pages, once the current transaction commits, that one of its tasks has new log lines."""
    after_commit.once(_Hint(job_id, LOGS_STORED), using)


@dataclass(frozen=True)
class _Hint:
    """An after-commit callback that knows which hint it sends (equal to the same hint), so a transaction queues each
    hint once."""

    job_id: int
    kind: str

    def __call__(self) -> None:
        publish(self.job_id, {"type": self.kind})
