"""Reading a task's whole log without holding it: pages of lines by keyset (seq), sent as they are read.

Both log views (the task log page and `GET /api/jobs/<id>/logs/<task>/`) stream through here. The response body is
an *async* iterator: under ASGI (daphne) Django reads a synchronous one into a list before sending the first byte,
which is the whole log in memory again. Each page is one short query (`seq > last ORDER BY seq LIMIT n`, the
(task, seq) unique index), so no transaction or server-side cursor stays open while a slow client reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse

from orchestrator.models import TaskLogLine

PAGE_LINES = 2000  # a page is at most 2,000 lines of up to 10,000 characters (contracts.limits.MAX_LOG_LINE_CHARS)

Line = tuple[int, str, str]  # seq, stream, text


def page_after(task_id: int, after: int, size: int = PAGE_LINES) -> list[Line]:
    """The task's next `size` lines above seq `after`, in seq order."""
    rows = TaskLogLine.objects.filter(task_id=task_id, seq__gt=after).order_by("seq")
    return list(rows.values_list("seq", "stream", "text")[:size])


async def chunks(
    task_id: int, render: Callable[[list[Line]], str], *, head: str = "", empty: str = "", tail: str = ""
) -> AsyncIterator[bytes]:
    """`head`, each page of the task's lines as `render` writes it (or `empty` when it has none), then `tail`."""
    if head:
        yield head.encode()
    after = -1
    sent = False
    while True:
        # In the request's own thread (thread-sensitive), whose connection Django closes when the response ends.
        page = await sync_to_async(page_after)(task_id, after)
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


def streaming(body: AsyncIterator[bytes], content_type: str, filename: str | None = None) -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, content_type=content_type)
    if filename is not None:
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
