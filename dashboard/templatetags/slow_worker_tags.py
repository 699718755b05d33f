"""`{% slow_worker job %}`: the job page's slow-worker panel (orchestrator/insights/slow_worker.py, computed at read
time), rendered by dashboard/_slow_worker.html; nothing for a job it does not apply to or that has not measured yet."""

from __future__ import annotations

from typing import Any

from django import template

from orchestrator.insights import slow_worker as insight
from orchestrator.models import Job

register = template.Library()

SHOWN_STATES = ("slow", "even", "too_early")


@register.inclusion_tag("dashboard/_slow_worker.html")
def slow_worker(job: Job) -> dict[str, Any]:
    found = insight.judge(job) if job.started_at else None
    return {"slow": found if found and found["state"] in SHOWN_STATES else None}
