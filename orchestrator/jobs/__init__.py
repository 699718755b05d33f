"""A job's way from placed to its end: the state machine driven by task events and the watchdog (restarts,
time limits, start-up deadlines, hangs, reaping), cancel and preempt, and the signed orders to agents (dispatch.py).

May import: contracts, core, models, plumbing, identity, objectstore, metrics, diagnosis (a failed end asks for its
verdict), usage (a task's end records its device-seconds). Never the scheduler: when devices free up it asks for a
pass by task name (orchestrator/plumbing/pass_requests.py)."""
