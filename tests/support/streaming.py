"""Reading a streamed response whose body is an async iterator (the log views) from a synchronous test."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync


def streamed(response: Any) -> bytes:
    """The whole body. The iterator's database reads run back on the calling thread, in the test's transaction."""

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()
