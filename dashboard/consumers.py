"""The job page's WebSocket: checks the user may see the job, sends history, then relays live frames.

No gap, no duplicate: the consumer joins the job's group *before* reading history, and frames queue until history
is sent; history ends at a cursor (the highest point id sent), and live metric points at or below it are dropped.
A reconnecting page passes `?since=<cursor>` and gets exactly what it missed. Point ids grow in commit order (one
in-order ingest worker), so "after id N" is well defined.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from orchestrator.downsample import lttb
from orchestrator.live import POINT_COLUMNS, group_name
from orchestrator.models import Job, MetricPoint

HISTORY_POINTS_PER_SERIES = 2000
HISTORY_FRAME_POINTS = 5000
FORBIDDEN = 4403


@database_sync_to_async
def _visible_job(user: Any, job_id: int) -> Job | None:
    if not user or not user.is_authenticated:
        return None
    jobs = Job.objects.all() if user.is_staff else Job.objects.filter(owner=user)
    return jobs.filter(pk=job_id).first()


@database_sync_to_async
def _history(job_id: int, since: int) -> tuple[list[list[Any]], int, bool]:
    """Points after `since`, each (task, phase, name) series cut to HISTORY_POINTS_PER_SERIES with LTTB when a page
    loads from scratch; the cursor is the highest id read, downsampled or not."""
    rows = list(
        MetricPoint.objects.filter(job_id=job_id, id__gt=since)
        .order_by("id")
        .values_list("id", "task_id", "phase", "name", "step", "epoch", "value", "ts")
    )
    cursor = rows[-1][0] if rows else since
    series: dict[tuple[int, str, str], list[list[Any]]] = defaultdict(list)
    for row in rows:
        series[(row[1], row[2], row[3])].append(list(row))
    downsampled = False
    points: list[list[Any]] = []
    for values in series.values():
        if since == 0 and len(values) > HISTORY_POINTS_PER_SERIES:
            values.sort(key=lambda p: p[4])
            values = lttb(values, HISTORY_POINTS_PER_SERIES, x=4, y=6)
            downsampled = True
        points.extend(values)
    points.sort(key=lambda p: p[0])
    return points, cursor, downsampled


class JobConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        job = await _visible_job(self.scope.get("user"), self.job_id)
        if job is None:
            await self.close(code=FORBIDDEN)
            return
        try:
            since = int(parse_qs(self.scope.get("query_string", b"").decode()).get("since", ["0"])[0])
        except ValueError:
            since = 0
        self.group = group_name(self.job_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        points, self.cursor, downsampled = await _history(self.job_id, max(since, 0))
        for start in range(0, len(points), HISTORY_FRAME_POINTS):
            await self.send_json(
                {
                    "type": "metrics",
                    "history": True,
                    "columns": POINT_COLUMNS,
                    "points": points[start : start + HISTORY_FRAME_POINTS],
                    "downsampled": downsampled,
                }
            )
        await self.send_json({"type": "history_end", "cursor": self.cursor, "downsampled": downsampled})

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        pass  # the page only listens

    async def live_frame(self, event: dict[str, Any]) -> None:
        frame = event["frame"]
        if frame.get("type") == "metrics":
            fresh = [p for p in frame["points"] if p[0] > self.cursor]
            if not fresh:
                return
            self.cursor = max(p[0] for p in fresh)
            frame = {**frame, "points": fresh, "history": False, "columns": POINT_COLUMNS, "cursor": self.cursor}
        await self.send_json(frame)
