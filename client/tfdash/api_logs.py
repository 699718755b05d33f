"""The client's log calls: a task's page of lines, every stored line of a job, and following a job's lines as they
are stored until it has ended and its last lines are in."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from tfdash.api_jobs import JobsApi
from tfdash.api_types import TERMINAL_STATES, LogLine, Task, task_label
from tfdash.errors import NotFound


class LogsApi(JobsApi):
    # --- logs -----------------------------------------------------------------------------------------------------
    def log_page(self, job_id: int, task_id: int, *, since: int = -1, raw: bool = False) -> dict[str, Any]:
        """One task's lines after the cursor `since`: `lines` (seq, stream, text), `next`, `more`. Each line's text
        as a terminal shows it (a progress bar at its last state), or as the task wrote it when `raw`."""
        params: dict[str, Any] = {"since": since, **({"raw": 1} if raw else {})}
        return dict(self._request("GET", f"/api/jobs/{int(job_id)}/logs/{int(task_id)}/lines/", params=params))

    def logs(self, job_id: int, *, task: str | None = None, raw: bool = False) -> Iterator[LogLine]:
        """Every stored line of the job's current tasks (or of `task`, e.g. "worker:0"), task after task."""
        for t in self._select_tasks(job_id, task):
            cursor = -1
            while True:
                page = self.log_page(job_id, t["id"], since=cursor, raw=raw)
                yield from (_line(t, line) for line in page["lines"])
                cursor = page["next"]
                if not page["more"]:
                    break

    def follow_logs(
        self, job_id: int, *, task: str | None = None, poll_s: float = 1.0, settle_s: float = 2.0, raw: bool = False
    ) -> Iterator[LogLine]:
        """The job's lines as they are stored, until it has ended and its last lines are in (a restarted job's new
        tasks are followed too). Polls each task's cursor, so nothing is missed or repeated. A task's last lines may
        be stored a moment after the job ends (they travel apart from its state): after the end it keeps reading
        until a round brings nothing new and `settle_s` has passed."""
        cursors: dict[int, int] = {}
        ended_at: float | None = None
        while True:
            if ended_at is None and self.job(job_id).get("state") in TERMINAL_STATES:
                ended_at = time.monotonic()
            new = 0
            for t in self._followed_tasks(job_id, task, ended=ended_at is not None):
                while True:
                    page = self.log_page(job_id, t["id"], since=cursors.get(t["id"], -1), raw=raw)
                    new += len(page["lines"])
                    yield from (_line(t, line) for line in page["lines"])
                    cursors[t["id"]] = page["next"]
                    if not page["more"]:
                        break
            if ended_at is not None and not new and time.monotonic() - ended_at >= settle_s:
                return
            time.sleep(poll_s)

    def _followed_tasks(self, job_id: int, task: str | None, *, ended: bool) -> list[Task]:
        """The tasks a follow reads this round. A job still waiting for its placement (`tfdash submit` then `tfdash
        logs -f --task worker:0` at once; passes are seconds apart) has no tasks yet: the named one is waited for
        while the job has none and has not ended; a name its tasks do not have is refused as without --follow."""
        tasks = self.tasks(job_id)
        if task is not None and not tasks and not ended:
            return []
        return self._select_tasks(job_id, task, tasks)

    def _select_tasks(self, job_id: int, task: str | None, tasks: list[Task] | None = None) -> list[Task]:
        if tasks is None:
            tasks = self.tasks(job_id)
        if task is None:
            return tasks
        chosen = [t for t in tasks if task_label(t) == task or str(t.get("id")) == task]
        if not chosen:
            known = ", ".join(task_label(t) for t in tasks) or "none yet"
            raise NotFound(f"Job {job_id} has no task {task!r} (its tasks: {known}).")
        return chosen


def _line(task: Task, line: Mapping[str, Any]) -> LogLine:
    return {
        "task": task_label(task),
        "task_id": int(task["id"]),
        "seq": int(line["seq"]),
        "stream": str(line["stream"]),
        "text": str(line["text"]),
    }
