"""The verdict the job page shows above the failed task's log tail (dashboard/_job_verdict.html): Job.diagnosis, which
orchestrator/diagnosis/ writes when a job ends failed or timed out (its shape: docs/api.md), read through its
`store.current` (one query, in a savepoint, when nothing changed) and shaped as the page needs it.

The stored dict is read, never trusted for shape: a field of the wrong type is left out rather than break the page
(or the socket's `job` frames, which render the same partial), and the links to the cause's and its peers' logs are
built here from ids, so the template never reverses a URL from stored data.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.urls import reverse

from contracts.limits import MAX_WORKERS
from orchestrator.diagnosis import store
from orchestrator.models import Job

log = logging.getLogger(__name__)

# Evidence lines and peers shown: the contract bounds the evidence to 12 lines; peers are one per other task of the
# attempt (at most contracts/limits.py's MAX_WORKERS and the ps), so these only guard against a row written otherwise.
MAX_EVIDENCE_LINES = 12
MAX_PEERS = 2 * MAX_WORKERS


def shown(job: Job) -> dict[str, Any]:
    """The verdict to render for `job`, or {} for none: only an ended job has one (a job restarted after a failure
    runs again; its old verdict is not its state)."""
    if not job.is_terminal:
        return {}
    # Made now when the job's end has not made it yet, or again when log lines came in since (a peer's last lines):
    # the page, and the socket frame sent when the job ends, never wait for the after-commit verdict.
    try:
        with transaction.atomic():  # a savepoint: a failure inside leaves the page's transaction usable
            diagnosis = store.current(job)
    except Exception:  # a verdict explains; making it must never break the page or its socket's frames
        log.exception("job %s: could not make its verdict; showing the stored one", job.pk)
        diagnosis = job.diagnosis
    if not isinstance(diagnosis, dict) or not diagnosis:
        return {}
    verdict = {key: _text(diagnosis.get(key)) for key in ("kind", "title", "message", "hint", "task")}
    verdict["log_url"] = _log_url(job, diagnosis.get("task_id"))
    evidence = diagnosis.get("evidence")
    verdict["evidence"] = [_text(line) for line in evidence[:MAX_EVIDENCE_LINES]] if isinstance(evidence, list) else []
    peers = diagnosis.get("peers")
    verdict["peers"] = [
        {
            "task": _text(peer.get("task")),
            "kind": _text(peer.get("kind")),
            "message": _text(peer.get("message")),
            "log_url": _log_url(job, peer.get("task_id")),
        }
        for peer in (peers[:MAX_PEERS] if isinstance(peers, list) else [])
        if isinstance(peer, dict)
    ]
    return verdict


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _log_url(job: Job, task_id: Any) -> str:
    if type(task_id) is not int or task_id <= 0:
        return ""
    # A job refused by its preflight carries the preflight's verdict: its tasks are the preflight job's.
    owner = job.diagnosis.get("preflight") if isinstance(job.diagnosis, dict) else None
    return reverse("dashboard:task-log", args=[owner if type(owner) is int else job.pk, task_id])
