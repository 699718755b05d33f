"""Submitting a job: its fields as people set them (one table for form, API and CLI), validation a user can act
on, content-addressed scripts, the plan, and the hand-off to the scheduler.

May import: core, models, plumbing, environments, scheduler, jobs."""
