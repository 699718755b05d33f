"""The plain-Python policy of the control plane, at the ground (no Django, no Celery; mypy --strict; tested
directly): gang placement of a job onto hosts (placement.py, shapes.py, hosts.py, assignment.py), the backfill plan
with its reservations (backfill.py, backfill_terms.py, backfill_lookups.py), whom to preempt (preemption.py), the
TF_CONFIG and environment of every task (tf_config.py), which failures are retried (restarts.py), which job states are
final (job_states.py), the scheduler's policy table (scheduler_policy.py), an experiment's verdict (verdict.py) and a
job's progress and ETA (progress.py).

May import: contracts. Imported by the models and every feature package; imports none of them."""
