"""`--wait`: a job's progress in the terminal while it runs: its state, the epoch against the run's epochs, and the
latest training loss (read from the metrics API with its cursor, so each point is read once). On a terminal one live
line (rich); otherwise (a CI log, a pipe) a plain line whenever the state or the epoch changes."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from tfdash.api_types import TERMINAL_STATES, Job
from tfdash.client import Client
from tfdash.job_progress import progress_text


class JobWatch:
    def __init__(self, api: Client, job_id: int, console: Console) -> None:
        self.api = api
        self.job_id = job_id
        self.console = console
        self.cursor = 0
        self.epoch: int | None = None
        self.loss: float | None = None
        self.accuracy: float | None = None
        self.started = time.monotonic()
        self._said = ""

    def run(self, *, poll_s: float = 1.0) -> Job:
        """Poll until the job has ended; returns the final job."""
        if self.console.is_terminal:
            with Live(Text(""), console=self.console, refresh_per_second=4, transient=False) as live:
                while True:
                    job = self._step()
                    live.update(Text.from_markup(self.line(job)))
                    if job.get("state") in TERMINAL_STATES:
                        return job
                    time.sleep(poll_s)
        while True:
            job = self._step()
            said = self.line(job, plain=True)
            key = f"{job.get('state')} {self.epoch} {progress_text(job, short=True).split(' · ')[0]}"
            if key != self._said:
                self._said = key
                self.console.print(said, markup=False)
            if job.get("state") in TERMINAL_STATES:
                return job
            time.sleep(poll_s)

    def _step(self) -> Job:
        job = self.api.job(self.job_id)
        self._read_metrics()
        return job

    def _read_metrics(self) -> None:
        while True:
            page = self.api.metrics(self.job_id, since=self.cursor)
            columns = page.get("columns") or []
            for row in page.get("points") or []:
                point = dict(zip(columns, row, strict=False))
                self._take(point)
            self.cursor = int(page.get("next", self.cursor))
            if not page.get("more"):
                return

    def _take(self, point: dict[str, Any]) -> None:
        name, value, epoch = point.get("name"), point.get("value"), point.get("epoch")
        if isinstance(epoch, int) and (self.epoch is None or epoch > self.epoch):
            self.epoch = epoch
        if not isinstance(value, int | float):
            return
        if name == "loss":
            self.loss = float(value)
        elif name in ("accuracy", "acc", "sparse_categorical_accuracy"):
            self.accuracy = float(value)

    def line(self, job: Job, *, plain: bool = False) -> str:
        state = str(job.get("state"))
        parts = [f"job {self.job_id}", state if plain else f"[bold]{state}[/]"]
        if job.get("attempt", 0) and int(job.get("attempt") or 0) > 1:
            parts.append(f"attempt {job.get('attempt')}")
        epochs = _epochs(job)
        if shown := progress_text(job):  # the server's: epoch k of N, step, examples/s, ETA
            parts.append(shown if plain else escape(shown))
        elif self.epoch is not None:
            parts.append(f"epoch {self.epoch}" + (f"/{epochs}" if epochs else ""))  # reported from 1
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.accuracy is not None:
            parts.append(f"accuracy {self.accuracy:.3f}")
        parts.append(f"{time.monotonic() - self.started:.0f} s")
        reason = str(job.get("reason") or "")
        if reason and state in ("queued", "failed", "restarting"):
            parts.append(reason if plain else escape(reason))
        return " · ".join(parts)


def _epochs(job: Job) -> int | None:
    config = job.get("builtin_config") if isinstance(job, dict) else None
    epochs = config.get("epochs") if isinstance(config, dict) else None
    return epochs if isinstance(epochs, int) else None
