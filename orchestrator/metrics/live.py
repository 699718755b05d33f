"""Pushing live frames to the browsers watching a job: one function, so every publisher goes through here.

Frames are JSON objects with a `type` ("metrics", "hosts", "job"); metric frames carry batches, never one point each.
A failure to publish never breaks the ingest that called it: the points are stored, and a page that missed a frame
gets them from history when it reconnects.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

POINT_COLUMNS = ["id", "task", "phase", "name", "step", "epoch", "value", "ts"]


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


def publish(job_id: int, frame: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    # The consumer's handler is `live_frame` (Channels maps "live.frame" to it).
    message = {"type": "live.frame", "frame": frame}
    future = asyncio.run_coroutine_threadsafe(layer.group_send(group_name(job_id), message), _publisher_loop())
    try:
        # Waited for, so frames of one job leave in the order they were stored (pages drop ids below their cursor).
        future.result(timeout=PUBLISH_TIMEOUT_S)
    except Exception as exc:  # Redis down or slow: the data is stored; pages catch up from history
        future.cancel()
        log.warning("could not publish a %s frame for job %s: %r", frame.get("type"), job_id, exc)
