"""The job page's one WebSocket: it checks the user may see the job, then carries everything the page shows live.

Frames (JSON, each with a `type`):
- `job`: state, reason and the rendered state/task-table/facts partial (dashboard/_job_live.html), and `task`: the
  current placement's tasks; both sent on connect and whenever the job or a task changes;
- `log`: new lines of a task (`[seq, stream, text]`) and the task's log `cursor`; on connect each task's last
  LOG_TAIL_LINES, or, for a task the page names in `?log_since=<task>:<seq>,...`, only the lines after its cursor;
- `metrics` (history, then live batches), `history_end` with the metric cursor, `hosts` (on connect the stored
  samples of every host that ran a task of the job, over the job's time, with `history` and the hosts' `windows`;
  then live samples), `facts`, `progress` (the job's epoch k of N and ETA, with the words to show).

No gap, no duplicate: the consumer joins the job's group *before* reading anything, so a change made meanwhile
arrives as a frame after the read. Metric points: history ends at a cursor (the highest point id sent); live points at
or below it are dropped; a reconnecting page passes `?since=<cursor>` and gets exactly what it missed, or, past
TFDASH_SOCKET_BACKLOG_POINTS, what it missed thinned per series (so no history load is unbounded). Log lines: per
task, the consumer sends the lines above the task's cursor (the highest seq sent without a hole below: lines of one
task may commit out of order; page_data.log_cursor), and a reconnecting page passes the cursors of its frames as
`log_since`. Log lines are numbered per task by its agent and stored by concurrent orchestrator workers, so, unlike
metric point ids, no one id orders them by commit: the cursor is per task. Job and task frames carry the whole
current state, so a missed one is repaired by the next, or by a reconnect.

Who may watch is checked at connect and again while the socket is open (dashboard/access.py): on every hint that the
job changed, when the user changes, and every TFDASH_SOCKET_RECHECK_S; a socket whose rights ended is closed with
4403, and one whose session ended (sign-out, flush) with 4401 at once. From the job's group, only the frames the
control plane publishes there are relayed (metrics, hosts, facts, progress, and the two hints); the page's `job`,
`task` and `log` frames are made here alone, so a frame put on the group by anyone else never reaches a page as one of
them.

Hints ("job changed", "logs stored") are answered by one read at a time: the handler only marks what is stale, so the
socket's channel never fills with hints (the layer drops past its capacity), and hints that arrive during a read are
answered together by the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.template.loader import render_to_string

from dashboard import access, page_data
from orchestrator.metrics import history, hosts, log_reader
from orchestrator.metrics.live import JOB_CHANGED, LOGS_STORED, group_name
from orchestrator.models import Job, TaskLogLine

log = logging.getLogger(__name__)

HISTORY_FRAME_POINTS = 5000
FORBIDDEN = 4403
# The socket's session ended (signed out, flushed, or replaced by a new key at a sign-in): the page reconnects with
# whatever session its browser now holds, and is refused, then shows "not allowed", if it holds none.
SESSION_ENDED = 4401
MAX_LOG_CURSORS = 1000  # `log_since` pairs read; a page names only its current placement's tasks


# Frames of the job's group sent on as they are (metrics are filtered by the cursor); `progress`: Job.progress and its
# words, after an ingest batch moved it (orchestrator/metrics/progress.py).
RELAYED = ("hosts", "facts", "progress")

_may_watch = database_sync_to_async(access.may_watch)
_access_groups = database_sync_to_async(access.groups)


def _metric_history(job_id: int, since: int) -> tuple[list[Any], int, bool]:
    """On a reconnect every point after `since`, up to TFDASH_SOCKET_BACKLOG_POINTS; a longer backlog (a tab asleep
    for hours) is sent thinned like a fresh load, from `since` on (the page keeps what it has). On a fresh load each
    series thinned (metrics/history.py). Either way bounded, whatever the job stores."""
    if since > 0:
        backlog = settings.TFDASH_SOCKET_BACKLOG_POINTS
        points = history.points_after(job_id, since, limit=backlog + 1)
        if len(points) <= backlog:
            return points, (points[-1][0] if points else since), False
        return history.thinned(job_id, after=since)
    return history.thinned(job_id)


# Off the consumer's one database thread (thread_sensitive=False: its own thread and connection), so a page's history
# is read while its state and log tail are (they are sent first; the history, the long read, waits for them).
_metric_history_apart = database_sync_to_async(_metric_history, thread_sensitive=False)


@database_sync_to_async
def _host_history(job_id: int) -> dict[str, Any]:
    """The stored samples of every host that ran a task of the job, over its window (metrics/hosts.py)."""
    windows, samples = hosts.job_samples(job_id)
    return {"type": "hosts", "history": True, "windows": [w.as_dict() for w in windows], "samples": samples}


@database_sync_to_async
def _job_frames(job_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job's `job` and `task` frames, read now."""
    job = Job.objects.select_related("owner", "cluster", "script", "failed_task", "failed_task__host").get(pk=job_id)
    parts = page_data.job_parts(job)
    job_frame = {
        "type": "job",
        "state": job.state,
        "reason": job.reason,
        "terminal": job.is_terminal,
        "attempt": job.attempt,
        "restarts": job.restarts,
        "html": render_to_string("dashboard/_job_live.html", {"job": job, **parts}),
    }
    tasks = [
        {
            "id": t.pk,
            "label": f"{t.type} {t.index}",
            "host": t.host.name if t.host else None,
            "state": t.state,
            "exit_code": t.exit_code,
            "restarts": t.restarts,
        }
        for t in parts["tasks"]
    ]
    return job_frame, {"type": "task", "attempt": job.attempt, "tasks": tasks}


@database_sync_to_async
def _new_log_lines(job_id: int, sent: dict[int, int]) -> dict[int, list[list[Any]]]:
    """Per task of the current placement: its lines above its cursor in `sent` (a task not in it gets its last
    LOG_TAIL_LINES), at most LOG_TAIL_LINES, the newest. Moves the cursors in `sent` on."""
    job = Job.objects.get(pk=job_id)
    new: dict[int, list[list[Any]]] = {}
    for task_id in job.tasks.filter(attempt=job.attempt).values_list("pk", flat=True):
        lines = TaskLogLine.objects.filter(task_id=task_id)
        if task_id in sent:
            lines = lines.filter(seq__gt=sent[task_id])
        newest = lines.order_by("-seq").values_list("seq", "stream", "text")[: page_data.LOG_TAIL_LINES]
        rows = log_reader.shown(list(reversed(newest)))  # each line as a terminal shows it (a bar at its last state)
        if not rows:
            continue
        new[task_id] = [list(row) for row in rows]
        sent[task_id] = page_data.log_cursor(sent.get(task_id), [row[0] for row in rows])
    return new


def _query(scope: dict[str, Any]) -> tuple[int, dict[int, int]]:
    """`since` (the metric cursor) and `log_since` (`<task>:<seq>` pairs, comma-separated) from the socket's URL; what
    does not parse is left out (the page then gets a fresh tail or history)."""
    query = parse_qs(scope.get("query_string", b"").decode())
    try:
        since = max(int(query.get("since", ["0"])[0]), 0)
    except ValueError:
        since = 0
    log_since: dict[int, int] = {}
    for pair in query.get("log_since", [""])[0].split(",")[:MAX_LOG_CURSORS]:
        task, _, seq = pair.partition(":")
        try:
            log_since[int(task)] = int(seq)
        except ValueError:
            continue
    return since, log_since


class JobConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        started = time.perf_counter()
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        # The access groups first: a sign-out between the check and joining them would otherwise go unheard.
        self.access_groups = await _access_groups(self.scope)
        for group in self.access_groups:
            await self.channel_layer.group_add(group, self.channel_name)
        if not await _may_watch(self.scope, self.job_id):
            await self.close(code=FORBIDDEN)
            return
        since, self.logs_sent = _query(self.scope)  # logs_sent: task -> log cursor (the page's, then what we sent)
        self.stale: set[str] = set()  # hints not answered yet
        self.catching_up: asyncio.Task[None] | None = None
        self.group = group_name(self.job_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        # The server's side of a page load (ms), sent in `history_end` for bench/page_load.py: cheap, always on.
        timing = {"checks_ms": _ms_since(started)}
        self.rechecking = asyncio.create_task(self._recheck_every(settings.TFDASH_SOCKET_RECHECK_S))
        mark = time.perf_counter()
        reading = asyncio.ensure_future(_metric_history_apart(self.job_id, since))
        try:
            await self._send_state()
            timing["state_ms"] = _ms_since(mark)
            await self._send_logs()
            timing["logs_ms"] = _ms_since(mark) - timing["state_ms"]
            points, self.cursor, downsampled = await reading
        except BaseException:
            reading.cancel()  # its thread finishes its read; nobody waits for it
            raise
        timing["history_query_ms"] = _ms_since(mark)  # from the start of the three reads: they overlap
        mark = time.perf_counter()
        for start in range(0, len(points), HISTORY_FRAME_POINTS):
            await self.send_json(
                {
                    "type": "metrics",
                    "history": True,
                    "columns": history.POINT_COLUMNS,
                    "points": points[start : start + HISTORY_FRAME_POINTS],
                    "downsampled": downsampled,
                }
            )
        timing["history_send_ms"] = _ms_since(mark)
        timing["points"] = len(points)
        await self.send_json(
            {"type": "history_end", "cursor": self.cursor, "downsampled": downsampled, "timing": timing}
        )
        # Host load so far, whole on every connect (the page keeps each host's samples once, by time); live samples
        # queued meanwhile are handled after this frame, so the page never sees a fresh one before the history.
        await self.send_json(await _host_history(self.job_id))

    async def disconnect(self, code: int) -> None:
        for task in (getattr(self, "catching_up", None), getattr(self, "rechecking", None)):
            if task is not None:
                task.cancel()
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)
        for group in getattr(self, "access_groups", ()):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        pass  # the page only listens

    async def _still_allowed(self) -> bool:
        """Checks again; closes the socket (4403) when its rights ended, or, when they cannot be checked now (the
        database away), with a plain close the page reconnects from."""
        try:
            allowed = await _may_watch(self.scope, self.job_id)
        except Exception:
            log.exception("job %s: could not check the socket's rights again", self.job_id)
            await self.close()
            return False
        if not allowed:
            await self.close(code=FORBIDDEN)
        return allowed

    async def _recheck_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if not await self._still_allowed():
                return

    async def session_ended(self, event: dict[str, Any]) -> None:
        await self.close(code=SESSION_ENDED)

    async def access_changed(self, event: dict[str, Any]) -> None:
        await self._still_allowed()

    async def _send_state(self) -> None:
        for frame in await _job_frames(self.job_id):
            await self.send_json(frame)

    async def _send_logs(self) -> None:
        for task_id, lines in (await _new_log_lines(self.job_id, self.logs_sent)).items():
            await self.send_json({"type": "log", "task": task_id, "lines": lines, "cursor": self.logs_sent[task_id]})

    async def _catch_up(self) -> None:
        """Answer the stale hints, one read at a time, until none is left."""
        try:
            while self.stale:
                stale, self.stale = self.stale, set()
                if JOB_CHANGED in stale:
                    if not await self._still_allowed():  # the job may have changed owner
                        return
                    await self._send_state()
                await self._send_logs()  # a new placement's tasks have their own lines
        except Job.DoesNotExist:
            await self.close(code=FORBIDDEN)
        except Exception:
            # The page reconnects from its cursors and reads the truth again.
            log.exception("job %s: could not send the job's state or log lines", self.job_id)
            await self.close()

    async def live_frame(self, event: dict[str, Any]) -> None:
        frame = event.get("frame")
        kind = frame.get("type") if isinstance(frame, dict) else None
        if kind in (JOB_CHANGED, LOGS_STORED):
            self.stale.add(kind)
            if self.catching_up is None or self.catching_up.done():
                self.catching_up = asyncio.create_task(self._catch_up())
        elif kind == "metrics":
            points = frame.get("points")
            fresh = [p for p in points if _point_id(p) > self.cursor] if isinstance(points, list) else []
            if fresh:
                self.cursor = max(p[0] for p in fresh)
                columns = history.POINT_COLUMNS
                await self.send_json(
                    {**frame, "points": fresh, "history": False, "columns": columns, "cursor": self.cursor}
                )
        elif kind in RELAYED:
            await self.send_json(frame)
        # Anything else (a `job` frame with markup, say) was not published by the control plane: dropped.


def _ms_since(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 1)


def _point_id(point: Any) -> int:
    """A metric row's id (its first column), or 0, which no cursor is below, for a row not of that shape."""
    if isinstance(point, list) and point and type(point[0]) is int:
        return int(point[0])
    return 0
