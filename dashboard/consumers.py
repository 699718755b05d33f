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
from django.db import connection

from orchestrator.metrics.downsample import lttb
from orchestrator.metrics.live import POINT_COLUMNS, group_name
from orchestrator.models import Job, MetricPoint

HISTORY_POINTS_PER_SERIES = 2000
HISTORY_FRAME_POINTS = 5000
FORBIDDEN = 4403


@database_sync_to_async
def _visible_job(user: Any, job_id: int) -> Job | None:
    return Job.objects.visible_to(user).filter(pk=job_id).first()


@database_sync_to_async
def _history(job_id: int, since: int) -> tuple[list[list[Any]], int, bool]:
    """Points after `since` (a reconnect: every one), or on a fresh load each (task, phase, name) series with more
    than HISTORY_POINTS_PER_SERIES points cut to the lowest and the highest point of each of half as many step
    buckets, in PostgreSQL: reading 400,000 rows into Python to thin them there took ~5.6 s (bench/page_load.py).
    The cursor is the highest id stored when the read began; nothing above it is sent, so a live frame never
    repeats a history point."""
    if since > 0 or connection.vendor != "postgresql":
        return _history_in_python(job_id, since)
    with connection.cursor() as cursor:
        cursor.execute(_SERIES_SQL, [job_id])
        series = cursor.fetchall()  # (task, phase, name, count, first step, last step, highest id)
        if not series:
            return [], 0, False
        top = max(row[6] for row in series)
        small = [row for row in series if row[3] <= HISTORY_POINTS_PER_SERIES]
        large = [row for row in series if row[3] > HISTORY_POINTS_PER_SERIES]
        points: list[list[Any]] = []
        if small:
            cursor.execute(_SMALL_SQL, [*_columns(small, 3), job_id, top])
            points.extend(list(row) for row in cursor.fetchall())
        if large:
            cursor.execute(_BUCKETS_SQL, [*_columns(large, 6), job_id, top, HISTORY_POINTS_PER_SERIES // 2])
            for task, phase, name, low, high in cursor.fetchall():
                for value, step, pk, epoch, ts in {tuple(low), tuple(high)}:
                    points.append([int(pk), task, phase, name, int(step), None if epoch < 0 else int(epoch), value, ts])
    points.sort(key=lambda p: p[0])
    return points, top, bool(large)


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Row tuples as one list per column (the first `width`), for unnest()."""
    return [list(column) for column in zip(*(row[:width] for row in rows), strict=True)]


_TABLE = MetricPoint._meta.db_table
_SERIES_SQL = f"""
    SELECT task_id, phase, name, count(*), min(step), max(step), max(id)
    FROM {_TABLE} WHERE job_id = %s GROUP BY task_id, phase, name
"""  # noqa: S608 - the table name is the model's; values are parameters
_SMALL_SQL = f"""
    SELECT p.id, p.task_id, p.phase, p.name, p.step, p.epoch, p.value, p.ts
    FROM {_TABLE} p
    JOIN unnest(%s::bigint[], %s::varchar[], %s::varchar[]) AS s(task_id, phase, name) USING (task_id, phase, name)
    WHERE p.job_id = %s AND p.id <= %s
"""  # noqa: S608
# min/max of an array compare element by element: the row with the lowest (highest) value in its bucket, whole.
_BUCKETS_SQL = f"""
    SELECT p.task_id, p.phase, p.name,
           min(ARRAY[p.value, p.step, p.id, coalesce(p.epoch, -1), p.ts]),
           max(ARRAY[p.value, p.step, p.id, coalesce(p.epoch, -1), p.ts])
    FROM {_TABLE} p
    JOIN unnest(%s::bigint[], %s::varchar[], %s::varchar[], %s::bigint[], %s::bigint[], %s::bigint[])
         AS s(task_id, phase, name, n, lo, hi) USING (task_id, phase, name)
    WHERE p.job_id = %s AND p.id <= %s
    GROUP BY p.task_id, p.phase, p.name, width_bucket(p.step, s.lo, s.hi + 1, %s)
"""  # noqa: S608


def _history_in_python(job_id: int, since: int) -> tuple[list[list[Any]], int, bool]:
    """Every point after `since`; on a fresh load (SQLite) each long series cut with LTTB."""
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
