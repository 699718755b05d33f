"""A job's progress in words, from the API's `progress` (epoch, epochs, step, steps, examples_per_s, eta_s, at; {}
before its first epoch): "epoch 3/10 · step 90/300 · 1,234 examples/s · ETA 2 min", or short for `tfdash ls`
("epoch 3/10 · ETA 2 min"). The ETA only while the job runs, less the time since it was measured (`at`).

The server's pages say the same words (orchestrator/core/progress.py `describe`); this distribution imports nothing
of the product, so the few lines are its own."""

from __future__ import annotations

import time
from typing import Any


def progress_text(job: Any, *, short: bool = False, now: float | None = None) -> str:
    progress = job.get("progress") if isinstance(job, dict) else None
    if not isinstance(progress, dict) or type(progress.get("epoch")) is not int:
        return ""
    epochs = progress.get("epochs")
    parts = [f"epoch {progress['epoch']}" + (f"/{epochs}" if type(epochs) is int else "")]
    step, steps = progress.get("step"), progress.get("steps")
    if not short and type(step) is int and type(steps) is int:
        parts.append(f"step {step:,}/{steps:,}")
    rate = progress.get("examples_per_s")
    if not short and isinstance(rate, int | float) and not isinstance(rate, bool):
        parts.append(f"{rate:,.0f} examples/s")
    eta, at = progress.get("eta_s"), progress.get("at")
    if job.get("state") == "running" and isinstance(eta, int | float) and isinstance(at, int | float):
        now = time.time() if now is None else now
        parts.append(f"ETA {eta_words(eta - max(0.0, now - at))}")
    return " · ".join(parts)


def eta_words(seconds: float) -> str:
    """'45 s', '2 min', '1 h 5 min'."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
