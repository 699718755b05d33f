"""Leases for the control plane's single actors: exactly one beat and one scheduler act at a time, however many
control planes run (Kubernetes' leader election by Lease, for kube-scheduler and the controller manager).

- store.py: the lease rows (orchestrator.models.ControlLease) and the three statements that touch them: take or
  renew, hand back, read. Every time in them is PostgreSQL's clock, never a worker's.
- keeper.py: a thread per lease in the process that competes for it; `acting()` says whether this process may act
  now, from its own monotonic clock (it stops before its lease can be taken, even while it cannot reach the database).
- beat.py: Celery beat's scheduler that sends periodic tasks only while its process holds the `beat` lease.
- queue_gate.py: a consumer step: a worker of the `scheduler` queue consumes it only while it holds the `scheduler`
  lease; `may_schedule()` is the pass's own check.

What the scheduler lease adds to the pass's lock of its cluster row (orchestrator/scheduler/scheduling.py), which alone
already keeps two passes from placing at once: a standby that would take half the passes and find the cluster held
(its pass then ends doing nothing, and the ask is covered by the other's), or run passes that interleave with the
holder's, now takes none; one process places, in queue order, and the other is a warm spare. The row lock stays the
safety; the lease is who acts. Beat has no such lock: two beats send every watchdog tick, rollup, retention and
webhook sweep twice; the lease makes it one.

May import: contracts, models (and Celery and Django). Nothing of jobs/, scheduler/ or agents/.
"""
