"""Reading a task's whole log without holding it: pages of lines by keyset (seq), sent as they are read.

Both log views (the task log page and `GET /api/jobs/<id>/logs/<task>/`) stream through here. The response body is
an *async* iterator: under ASGI (daphne) Django reads a synchronous one into a list before sending the first byte,
which is the whole log in memory again. Each page is one short query (`seq > last ORDER BY seq LIMIT n`, the
(task, seq) unique index), so no transaction or server-side cursor stays open while a slow client reads.

Lines are stored as the task wrote them and rendered here, as they are read: each line as a terminal would leave it
(contracts/terminal_text.py: a tf_keras progress bar at its last state, not its thousands of redraws), unless the
reader asks for the raw text (`?raw=1`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse

from contracts.terminal_text import render_line
from orchestrator.models import TaskLogLine

PAGE_LINES = 2000  # a page is at most 2,000 lines of up to 10,000 characters (contracts.limits.MAX_LOG_LINE_CHARS)

Line = tuple[int, str, str]  # seq, stream, text


RAW_PARAM = "raw"  # the query parameter that asks for the lines as stored: ?raw=1


def wants_raw(value: str | None) -> bool:
    """Whether a `raw` query parameter's value asks for the stored text."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def shown(lines: list[Line], *, raw: bool = False) -> list[Line]:
    """`lines` as a reader sees them: each at its terminal state, or as stored when `raw`."""
    return lines if raw else [(seq, stream, render_line(text)) for seq, stream, text in lines]


def page_after(task_id: int, after: int, size: int = PAGE_LINES) -> list[Line]:
    """The task's next `size` lines above seq `after`, in seq order."""
    rows = TaskLogLine.objects.filter(task_id=task_id, seq__gt=after).order_by("seq")
    return list(rows.values_list("seq", "stream", "text")[:size])


async def chunks(
    task_id: int,
    render: Callable[[list[Line]], str],
    *,
    head: str = "",
    empty: str = "",
    tail: str = "",
    raw: bool = False,
) -> AsyncIterator[bytes]:
    """`head`, each page of the task's lines (rendered unless `raw`, see `shown`) as `render` writes it (or `empty`
    when it has none), then `tail`."""
    if head:
        yield head.encode()
    after = -1
    sent = False
    while True:
        # In the request's own thread (thread-sensitive), whose connection Django closes when the response ends.
        page = await sync_to_async(_shown_page)(task_id, after, raw)  # rendered off the event loop too
        if page:
            sent = True
            yield render(page).encode()
            after = page[-1][0]
        if len(page) < PAGE_LINES:
            break
    if not sent and empty:
        yield empty.encode()
    if tail:
        yield tail.encode()


def _shown_page(task_id: int, after: int, raw: bool) -> list[Line]:
    return shown(page_after(task_id, after), raw=raw)


def streaming(body: AsyncIterator[bytes], content_type: str, filename: str | None = None) -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, content_type=content_type)
    if filename is not None:
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
