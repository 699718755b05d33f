"""Submitting a job: its fields as people set them (job_fields.py: one table for form, API and CLI), validation a
user can act on, content-addressed scripts, the plan, and the hand-off to the scheduler (submission.py).

May import: contracts, core, limits, models, plumbing, environments, jobs, scheduler."""
