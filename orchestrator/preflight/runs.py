"""A preflight made (`start`): a job of its own that runs the checked job's program, environment, requirements,
variables, arguments and labels in its strategy's single-worker form (orchestrator/core/preflight.py) for at most
`STEPS` steps of `fit` or `TIME_LIMIT_S` seconds from its placement, whichever comes first. Called at submission,
in the checked job's transaction, once the checked job has its id."""

from __future__ import annotations

from django.conf import settings

from orchestrator.core import preflight as rules
from orchestrator.models import Job, JobEvent

NAME_PREFIX = "preflight of #"


def steps() -> int:
    return int(settings.TFDASH_PREFLIGHT_STEPS)  # rules.STEPS unless staff set it


def time_limit_s() -> int:
    return int(settings.TFDASH_PREFLIGHT_TIME_LIMIT_S)  # rules.TIME_LIMIT_S unless staff set it


def build(job: Job) -> Job:
    """The preflight of `job` (saved or not: `plan` it before deciding), unsaved; it keeps no restarts, no hang
    detection beyond its time limit, and the checked job's priority class (but never preempts: the scheduler)."""
    workers, ps, devices = rules.single_worker_shape(job.strategy, job.workers, job.ps, job.devices_per_worker)
    return Job(
        owner_id=job.owner_id,
        cluster_id=job.cluster_id,
        name=f"{NAME_PREFIX}{job.pk}: {job.name}"[:200] if job.pk else f"preflight: {job.name}"[:200],
        strategy=job.strategy,
        program_kind=job.program_kind,
        script_id=job.script_id,
        builtin=job.builtin,
        builtin_config=job.builtin_config,
        args=job.args,
        env=job.env,
        environment=job.environment,
        requirements=job.requirements,
        workers=workers,
        ps=ps,
        devices_per_worker=devices,
        labels=job.labels,
        max_restarts=0,
        restart_policy=job.restart_policy,
        progress_timeout_s=0,  # its time limit bounds it
        legacy_keras=job.legacy_keras,
        startup_deadline_s=job.startup_deadline_s,
        time_limit_s=time_limit_s(),
        priority_class_id=job.priority_class_id,
        preflight={"steps": steps()},  # what the runtime is told (orchestrator/jobs/dispatch.py)
    )


def start(job: Job) -> Job:
    """Save a preflight of the saved, queued `job` and have the job wait for it (inside the submission's
    transaction); the submission's pass places the preflight ahead of the queue."""
    preflight = build(job)
    preflight.preflight_for = job
    preflight.save()
    job.preflight = {"state": rules.RUNNING, "job": preflight.pk, "steps": steps(), "limit_s": preflight.time_limit_s}
    job.reason = waiting_reason(preflight.pk)
    job.save(update_fields=["preflight", "reason"])
    JobEvent.objects.create(
        job=job,
        kind="preflight",
        text=f"preflight #{preflight.pk} started: its script for at most {steps()} steps or "
        f"{preflight.time_limit_s} s on one worker before the job waits for its devices",
    )
    return preflight


def waiting_reason(preflight_id: int) -> str:
    """What a job waiting for its preflight says (the scheduler tells it so on every pass)."""
    return f"preflight #{preflight_id} running: it is placed once its preflight passes"
