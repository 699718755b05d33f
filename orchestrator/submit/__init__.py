"""Submitting a job: its fields as people set them (job_fields.py: one table for form, API and CLI), validation a
user can act on, content-addressed scripts, the plan, whether it gets a preflight, and the hand-off to the scheduler
(submission.py).

May import: contracts, core, limits, models, plumbing, environments, jobs, preflight (a job's preflight made with it),
scheduler."""
