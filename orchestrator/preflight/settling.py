"""A preflight's end, applied to the job it checks (`settle`): asked by every scheduler pass for the jobs of its queue
that wait for a preflight, so a preflight's end is applied before the pass that could place its job, whatever event
(a task's exit, the time limit, a cancel, a lost host) ended it. Passed or skipped: the job queues as any other (an
event says so); failed: the job ends failed, "refused by its preflight #N: ...", with the preflight's verdict as its
own (`Job.diagnosis`): it never held a device of its gang."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.utils import timezone

from orchestrator.core import preflight as rules
from orchestrator.diagnosis import store as diagnoses
from orchestrator.jobs.lifecycle import end_job
from orchestrator.models import TERMINAL_JOB_STATES, Job, JobEvent, JobState, Task, TaskState
from orchestrator.plumbing.compiled_writes import save_fields

log = logging.getLogger(__name__)

EVIDENCE_LINES = 12  # as many as a diagnosis carries (issue 45's shape)


def settle(awaiting: Mapping[int, int]) -> dict[int, str]:
    """`awaiting`: checked job id -> the id of the preflight it waits for. Apply every ended preflight's outcome to
    its job (its row locked; inside the caller's transaction, the scheduler pass's); returns checked job id ->
    outcome (rules.PASSED, FAILED or SKIPPED) for the jobs settled now. One query when none has ended."""
    if not awaiting:
        return {}
    ended = set(
        Job.objects.filter(pk__in=set(awaiting.values()), state__in=TERMINAL_JOB_STATES).values_list("pk", flat=True)
    )
    settled: dict[int, str] = {}
    for checked_id in sorted(c for c, p in awaiting.items() if p in ended):  # rows locked in id order (row_locks.py)
        outcome = _settle_one(checked_id, awaiting[checked_id])
        if outcome:
            settled[checked_id] = outcome
    return settled


def _settle_one(checked_id: int, preflight_id: int) -> str:
    job = Job.objects.select_for_update().filter(pk=checked_id).first()
    if job is None or job.is_terminal or rules.awaited(job.preflight) != preflight_id:
        return ""  # cancelled meanwhile, or settled by another pass
    run = Job.objects.get(pk=preflight_id)
    verdict = verdict_of(run) if run.state == JobState.FAILED else {}
    outcome = rules.outcome(run.state, str(verdict.get("kind", "")))
    took = _seconds(run)
    if outcome == rules.PASSED:
        text = f"preflight #{run.pk} passed in {took:.0f} s"
        if run.state == JobState.TIMED_OUT:
            text += f": it ran its {run.time_limit_s} s bound without failing"
    elif outcome == rules.FAILED:
        text = f"refused by its preflight #{run.pk}: {verdict.get('message') or run.reason}"
    else:
        text = f"preflight #{run.pk} {run.get_state_display()} ({run.reason}): the job queues without its verdict"
    job.preflight = {**job.preflight, "state": outcome, "reason": text[:2000], "seconds": took}
    JobEvent.objects.create(job=job, kind="preflight", text=text[:500])
    log.info("job %s: %s", job.pk, text)
    if outcome == rules.FAILED:
        # Its own attempt has no task and no log line (lines_in 0): the verdict stays the preflight's.
        job.diagnosis = {**verdict, "preflight": run.pk, "lines_in": 0}
        save_fields(job, ["preflight", "diagnosis"])
        end_job(job, JobState.FAILED, text)
    else:
        job.reason = ""  # the pass tells it why it waits now
        save_fields(job, ["preflight", "reason"])
    return outcome


def _seconds(run: Job) -> float:
    """From the preflight's submission to its end: what the checked job waited for it."""
    end = run.finished_at or timezone.now()
    return round((end - run.created_at).total_seconds(), 1)


def verdict_of(run: Job) -> dict[str, Any]:
    """The failed preflight's verdict (orchestrator/diagnosis/: made now if its end's has not been yet), else one of
    the same shape from its failed task (label, exit code, last log lines)."""
    try:
        made = diagnoses.diagnose(run)
    except Exception:  # a verdict explains; the refusal stands without it
        log.exception("preflight %s: no verdict", run.pk)
        made = {}
    if made:
        return dict(made)
    task = run.failed_task or (
        Task.objects.filter(job=run, attempt=run.attempt, state=TaskState.FAILED).order_by("finished_at", "pk").first()
    )
    lines = [line.text for line in task.log_tail(EVIDENCE_LINES)] if task is not None else []
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    label = task.label if task is not None else ""
    how = f"exited with code {task.exit_code}" if task is not None and task.exit_code is not None else "failed"
    subject = label or f"preflight #{run.pk}"
    return {
        "kind": "unknown",
        "title": f"{subject} {how}"[:200],
        "message": f"{subject} {how}: {last or run.reason}"[:1000],
        "hint": "Fix what its last lines say and submit the job again; its preflight ran it on one worker.",
        "task": label,
        "task_id": task.pk if task is not None else None,
        "evidence": lines[-EVIDENCE_LINES:],
        "peers": [],
        "at": timezone.now().isoformat(),
    }
