"""The verdict saved on its job (Job.diagnosis): `diagnose` reads the failed attempt's tasks and their log tails,
asks classify.py and saves what it says; `current` is what a page or the API shows, computed again when log lines
came in since (a peer's lines arrive after the job's end, through the ingest). `diagnose_after_commit` is what the
job's end calls (orchestrator/jobs/lifecycle.py): once per transaction, after it commits, never failing the caller.

The verdict carries `lines_in`, the attempt's log line count it was computed from (Task.log_lines_in summed): equal
counts mean nothing new to read, so asking again costs one query."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db.models import Sum

from contracts.terminal_text import render_lines
from orchestrator.diagnosis.classify import JobEnd, TaskEnd, classify
from orchestrator.models import Job, JobState, Script, Task
from orchestrator.plumbing import after_commit

log = logging.getLogger(__name__)

DIAGNOSED_STATES = (JobState.FAILED, JobState.TIMED_OUT)
# Log lines read per task: a Python traceback through TensorFlow runs to ~30 lines, Keras 3's PerReplica error prints
# the batch after its exception line, and a graph execution error's "Detected at node" listing (ParameterServer's
# save) puts ~150 lines between its exception line and its status lines ("(0) NOT_FOUND: ...").
TAIL_LINES = 200


def _lines_in(job: Job) -> int:
    counted = Task.objects.filter(job_id=job.pk, attempt=job.attempt).aggregate(lines=Sum("log_lines_in"))["lines"]
    return int(counted or 0)


def diagnose(job: Job | int, *, fresh: bool = False) -> dict[str, Any]:
    """The job's verdict, computed and saved when it has none, when log lines came in since, or when `fresh`;
    {} for a job that did not fail or time out."""
    job = Job.objects.get(pk=job) if isinstance(job, int) else job
    if job.state not in DIAGNOSED_STATES:
        return {}
    lines_in = _lines_in(job)
    if job.diagnosis and not fresh and job.diagnosis.get("lines_in") == lines_in:
        return job.diagnosis
    tasks = list(Task.objects.filter(job_id=job.pk, attempt=job.attempt).select_related("host"))
    script_name = Script.objects.filter(pk=job.script_id).values_list("filename", flat=True).first() or ""
    end = JobEnd(
        state=job.state,
        reason=job.reason,
        strategy=job.strategy,
        failed_task_id=job.failed_task_id,
        script_file=f"{job.script_id}.py" if job.script_id else "",
        script_name=script_name,
    )
    verdict = classify(end, [_task_end(task) for task in tasks])
    verdict["lines_in"] = lines_in
    # Only over a job still in the state it was judged in: a verdict never lands on a job that moved on.
    Job.objects.filter(pk=job.pk, state=job.state, attempt=job.attempt).update(diagnosis=verdict)
    job.diagnosis = verdict
    return verdict


def current(job: Job) -> dict[str, Any]:
    """The verdict to show now: the saved one, or a new one when the tasks' log lines moved since it was made."""
    return diagnose(job)


def _task_end(task: Task) -> TaskEnd:
    newest = task.log_lines.order_by("-seq").values_list("received_at", flat=True).first()
    return TaskEnd(
        label=task.label,
        id=task.pk,
        type=task.type,
        index=task.index,
        state=task.state,
        exit_code=task.exit_code,
        detail=task.detail,
        finished_at=task.finished_at,
        # As a terminal shows them (a progress bar at its last state): the evidence is read, not its redraws.
        lines=tuple(render_lines([line.text for line in task.log_tail(TAIL_LINES)])),
        host=task.host.name if task.host_id else "",
        last_seen=newest,
    )


@dataclass(frozen=True)
class _Diagnose:
    """A job's verdict to make once the transaction that ended it (or one of its tasks) commits; equal values are
    queued once per transaction (orchestrator/plumbing/after_commit.py)."""

    job_id: int
    fresh: bool

    def __call__(self) -> None:
        try:
            diagnose(self.job_id, fresh=self.fresh)
        except Exception:  # a verdict is an explanation: its failure must never fail the job's end
            log.exception("job %s: could not diagnose", self.job_id)


def diagnose_after_commit(job_id: int, *, fresh: bool = False) -> None:
    """`fresh` when a task's end changed what the verdict says, not its lines: a peer stopped after the job's end is
    listed once it ends, though a page may have saved a verdict with the same lines while it still ran. (Not at the
    job's own end: a preflight's refusal saved the verdict the job keeps.)"""
    after_commit.once(_Diagnose(job_id, fresh))
