"""A preflight's rules, plain Python: when a job gets one by default, the single-worker form it runs in, whether a job
waits for one, and what a preflight's end means for the job it checks. orchestrator/preflight/ writes the rows;
the scheduler (its skip), submission (the default) and the job lifecycle read these.

A preflight is a small job of its own (`Job.preflight_for` names the job it checks) that runs the checked job's
program in its strategy's single-worker form for a few steps (the runtime stops `fit` after STEPS, read from
`PREFLIGHT_STEPS_ENV` in contracts/task_wire.py) or until its time limit. The checked job's `Job.preflight` is
{"state": ..., "job": <preflight id>, "reason": "...", "seconds": float}; while the state is RUNNING the scheduler does
not place it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contracts.strategies import Strategy

RUNNING = "running"
PASSED = "passed"
FAILED = "failed"
# The preflight said nothing about the script (it was cancelled, or its host failed under it): the job queues as if
# it had none.
SKIPPED = "skipped"
STATES = (RUNNING, PASSED, FAILED, SKIPPED)

# A gang of at least this many workers gets a preflight by default (when it must wait and one device is free now):
# below it the preflight would need the very devices the job waits for.
DEFAULT_MIN_WORKERS = 2
# Steps the runtime lets a preflight's `fit` run before it stops it (model.stop_training).
STEPS = 20
# Its time limit, from its placement, start-up included: what a custom loop (no `fit` to stop) runs at most, and
# the longest it holds its one device (plus the cluster's stop grace).
TIME_LIMIT_S = 150

# Diagnosis kinds (orchestrator/diagnosis/rules.py) that blame the host or the product, not the script: such a failed
# preflight is no verdict on the job (never_connected: its one process was not up and listening within the start-up
# deadline, which a slow host or a script that loads its data before its strategy may cause).
NOT_THE_SCRIPT = frozenset({"host_lost", "port_taken", "never_connected", "stopped"})


def awaited(preflight: Mapping[str, Any] | None) -> int | None:
    """The id of the preflight a job waits for (its `Job.preflight` says it runs), else None: the one rule the
    scheduler's skip, its re-check under lock and the lifecycle read."""
    if not isinstance(preflight, Mapping) or preflight.get("state") != RUNNING:
        return None
    job = preflight.get("job")
    return job if isinstance(job, int) else None


def wanted(asked: bool | None, workers: int, gang_fits_now: bool, preflight_fits_now: bool) -> bool:
    """Whether a submitted job gets a preflight. `asked` True or False is the submitter's word; None (the default):
    a gang of DEFAULT_MIN_WORKERS or more that does not fit the devices free now while its single-worker form does.
    A job that fits starts at once (a failure at import then costs seconds, not a wait); one whose preflight could
    not start either would only wait longer."""
    if asked is not None:
        return asked
    return workers >= DEFAULT_MIN_WORKERS and not gang_fits_now and preflight_fits_now


def single_worker_shape(strategy: str, workers: int, ps: int, devices_per_worker: int) -> tuple[int, int, int]:
    """(workers, ps, devices_per_worker) of a job's strategy's single-worker form: one worker on one device, and for
    ParameterServer one ps beside it (and its chief, which holds no device), the smallest cluster that strategy
    runs."""
    del workers, ps, devices_per_worker  # every form is one worker on one device, whatever the job's size
    return (1, 1 if Strategy(strategy) is Strategy.PARAMETER_SERVER else 0, 1)


def outcome(preflight_state: str, diagnosis_kind: str = "") -> str:
    """What a preflight's final state means for the job it checks: PASSED (it succeeded: its step bound stopped fit,
    or the script ended; or it ran its whole time limit without failing), FAILED (the script failed: the job is
    refused), SKIPPED (cancelled, or a failure of its host rather than of the script)."""
    if preflight_state in ("succeeded", "timed_out"):
        return PASSED
    if preflight_state == "failed":
        return SKIPPED if diagnosis_kind in NOT_THE_SCRIPT else FAILED
    return SKIPPED
