"""A job's progress in words, as the server says it in the API's `progress` (`text`: "epoch 3/10 · step 90/300 ·
1,234 examples/s · ETA 2 min"; `short`, for `tfdash ls`: "epoch 3/10 · ETA 2 min"); "" before its first epoch. The
rule that makes the words is the server's alone (orchestrator/core/progress.py `describe`): the pages and this
command say the same."""

from __future__ import annotations

from typing import Any


def progress_text(job: Any, *, short: bool = False) -> str:
    progress = job.get("progress") if isinstance(job, dict) else None
    words = progress.get("short" if short else "text") if isinstance(progress, dict) else None
    return words if isinstance(words, str) else ""
