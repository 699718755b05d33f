"""The scheduler, in one place: the pass (scheduling.py, starts.py, waiting_reasons.py), queue order, priority
classes, quotas and fair share (queueing.py, class_rights.py), the fleet as a pass reads it (fleet_state.py,
active_tasks.py), backfill reservations and preemption (the choices themselves are plain Python in
orchestrator/core/; protection.py says whether a running job is protected from it now), plans that write nothing
(job_plans.py), the queue view staff act on, task rows and uid slots.

May import: contracts, core, models, plumbing, identity, environments, metrics, jobs (to place and stop jobs),
preflight (a pass applies ended preflights before it places). Jobs never import the scheduler."""
