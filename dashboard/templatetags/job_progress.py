"""`{{ job|progress_text }}`: a job's progress in words on its page (dashboard/job_rows.py progress_text)."""

from __future__ import annotations

from django import template

from dashboard.job_rows import progress_text as job_progress_text
from orchestrator.models import Job

register = template.Library()


@register.filter
def progress_text(job: Job) -> str:
    return job_progress_text(job)
