"""`{% input_bound job %}`: the job page's "Is it input-bound?" panel (orchestrator/insights/input_bound.py, computed
at read time), rendered by dashboard/_input_bound.html: per worker, or why nothing was measured (a custom loop,
ParameterServer); nothing before the job starts."""

from __future__ import annotations

from typing import Any

from django import template

from orchestrator.insights import input_bound as insight
from orchestrator.models import Job

register = template.Library()


@register.inclusion_tag("dashboard/_input_bound.html")
def input_bound(job: Job) -> dict[str, Any]:
    return {"input": insight.judge(job) if job.started_at else None}
