"""Storing task log lines within each task attempt's log limit (limits.TFDASH_MAX_LOG_BYTES_PER_TASK).

Runs inside the ingest's transaction, which holds each task's row (orchestrator/models/row_locks.py), and reads its
running total (`Task.log_bytes`); lines already stored (a re-read stream entry, a redelivered batch) are recognised
by (task, seq) and neither stored nor counted again; new lines are stored in seq order while they fit. The first line
that does not fit is replaced by ONE marker line (at its seq, so the marker sits where the output was cut) and
`Task.log_truncated` is set in the same transaction: every later line of the task, redelivered or new, is dropped
without another marker.
"""

from __future__ import annotations

from collections import defaultdict

from django.conf import settings

from orchestrator import limits
from orchestrator.models import Task, TaskLogLine


def store_lines(lines: list[TaskLogLine]) -> int:
    """Store `lines` (unsaved, of any tasks) within their tasks' limits; returns how many rows were added (a marker
    included). Call inside a transaction that holds the rows of their tasks (orchestrator/models/row_locks.py)."""
    by_task: dict[int, dict[int, TaskLogLine]] = defaultdict(dict)
    for line in lines:
        by_task[line.task_id].setdefault(line.seq, line)  # the same seq twice in one run: the first (as stored)
    tasks = Task.objects.filter(pk__in=by_task).order_by("pk").values_list("pk", "log_bytes", "log_truncated")
    limit = settings.TFDASH_MAX_LOG_BYTES_PER_TASK
    rows: list[TaskLogLine] = []
    for task_id, used, cut_before in tasks:
        if cut_before:
            continue
        truncated = False
        batch = by_task[task_id]
        stored = set(TaskLogLine.objects.filter(task_id=task_id, seq__in=list(batch)).values_list("seq", flat=True))
        added = 0
        for seq in sorted(batch.keys() - stored):
            line = batch[seq]
            size = limits.line_bytes(line.text)
            if used + added + size > limit:
                rows.append(TaskLogLine(task_id=task_id, seq=seq, stream="stderr", text=limits.log_truncated_marker()))
                truncated = True
                break
            rows.append(line)
            added += size
        if added or truncated:
            Task.objects.filter(pk=task_id).update(log_bytes=used + added, log_truncated=truncated)
    # Nothing here can conflict (the rows are locked and stored seqs left out); ignore_conflicts is belt and braces.
    TaskLogLine.objects.bulk_create(rows, ignore_conflicts=True)
    for task_id, batch in by_task.items():
        # How far the task's output is in, a line cut by the limit counted too: its exit waits for this.
        upto = max(batch) + 1
        Task.objects.filter(pk=task_id, log_lines_in__lt=upto).update(log_lines_in=upto)
    return len(rows)
