"""The scheduler, in one place: the pass (orchestrator/scheduler/scheduling.py), queue order, priority classes,
quotas and fair share (queueing.py), the fleet as a pass reads it, backfill reservations and preemption (the choices
themselves are plain Python in orchestrator/core/), the queue view staff act on, task rows and uid slots.

May import: core, models, plumbing, identity, environments, metrics, jobs (to place and stop jobs). Jobs never
import the scheduler."""
