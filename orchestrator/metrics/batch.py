"""What the ingest collects from a drained run of reports before writing it (orchestrator/metrics/ingest.py): rows,
and the per-task running totals the reports carry (points shed, output dropped)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.metrics import drops
from orchestrator.metrics.points import PointRow
from orchestrator.models import Host, HostSample, Task, TaskLogLine


@dataclass
class Batch:
    """The rows a drained run of reports makes, collected report by report before one transaction writes them."""

    points: list[PointRow] = field(default_factory=list)
    # per task: (task, its facts, when its report was sealed); the newest report's per task
    facts: dict[int, tuple[Task, dict[str, Any], float]] = field(default_factory=dict)
    samples: dict[int, tuple[Host, list[HostSample]]] = field(default_factory=dict)
    lines: list[TaskLogLine] = field(default_factory=list)
    log_jobs: set[int] = field(default_factory=set)
    shed: dict[int, int] = field(default_factory=dict)  # per task: the highest running total of points its agent shed
    dropped: dict[int, drops.Drops] = field(default_factory=dict)  # per task: the highest totals of output dropped
    stored_points: dict[int, list[list[Any]]] = field(default_factory=dict)  # per job, once written
    stored_lines: int = 0  # once written: log lines (and truncation markers) added

    @classmethod
    def empty(cls) -> Batch:
        return cls()

    def add(self, other: Batch) -> None:
        """Take in what one report collected (into a batch of its own, so a report that fails halfway adds nothing)."""
        self.points.extend(other.points)
        for task_id, reported in other.facts.items():
            if task_id not in self.facts or reported[2] >= self.facts[task_id][2]:
                self.facts[task_id] = reported
        for host_id, (host, rows) in other.samples.items():
            self.samples.setdefault(host_id, (host, []))[1].extend(rows)
        self.lines.extend(other.lines)
        self.log_jobs |= other.log_jobs
        for task_id, shed in other.shed.items():
            self.shed[task_id] = max(shed, self.shed.get(task_id, 0))
        for task_id, dropped in other.dropped.items():
            drops.merge(self.dropped, task_id, dropped)
