"""Compare-strategies experiments: create one (every variant checked up front), submit its runs, cancel it.

Each run is an ordinary Job (Job.experiment, Job.variant), submitted through `submission` like any other, so the
per-user active-jobs limit and placement apply unchanged. One after another (the default): the next variant's job is
submitted once no run of the experiment is active. Side by side: every variant's job is submitted at once and the
FIFO scheduler runs them together where capacity allows (queued behind each other where it does not).

`advance` is level-triggered: the watchdog's tick and every scheduler pass call it for every experiment with a
variant still without a job, so a lost message or a restart of the control plane cannot stall an experiment. It is
idempotent: the experiment row is locked, and a unique constraint keeps one job per variant whatever races.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from contracts.strategies import STRATEGY_LABELS, Strategy
from orchestrator import limits
from orchestrator.core.verdict import is_baseline
from orchestrator.jobs import lifecycle
from orchestrator.models import TERMINAL_JOB_STATES, Experiment, ExperimentMode, Job, JobState, Script
from orchestrator.scheduler import job_plans
from orchestrator.submit import job_fields, submission

log = logging.getLogger(__name__)

MIN_VARIANTS = 2
MAX_VARIANTS = 8  # the comparison's own bound: past it the charts and columns stop being readable
VARIANT_SHAPE = ("strategy", "workers", "ps", "devices_per_worker")
# The Job columns every run shares, as the experiment stores them (the shape's four come from the variant).
_COMMON_FIELDS = tuple(f for f in job_fields.SHAPE_FIELDS if f not in (*VARIANT_SHAPE, "name"))


class ExperimentInvalid(submission.JobInvalid):
    """(field, message) pairs, as for a job; variant problems are on `variants`."""


@dataclass(frozen=True)
class Variant:
    strategy: str
    workers: int
    ps: int
    devices_per_worker: int

    @property
    def label(self) -> str:
        if is_baseline(self.strategy, self.workers, self.ps, self.devices_per_worker):
            return "1-replica baseline"
        name = STRATEGY_LABELS[Strategy(self.strategy)].removesuffix("Strategy")
        if self.strategy == Strategy.MIRRORED:
            return f"{name} × {self.devices_per_worker} devices"
        ps = f" + {self.ps} ps" if self.ps else ""
        return f"{name} {self.workers} × {self.devices_per_worker}{ps}"

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, **{k: getattr(self, k) for k in VARIANT_SHAPE}}


def parse_variants(raw: Any) -> list[Variant]:
    """Variants from a list of {"strategy", "workers", "ps", "devices_per_worker"}; raises ExperimentInvalid."""
    if not isinstance(raw, list):
        raise ExperimentInvalid([("variants", "Give a list of variants (strategy, workers, ps, devices_per_worker).")])
    variants: list[Variant] = []
    problems: list[str] = []
    for n, item in enumerate(raw, start=1):
        if not isinstance(item, Mapping):
            problems.append(f"Variant {n} is not an object.")
            continue
        strategy = item.get("strategy")
        if strategy not in [s.value for s in Strategy]:
            problems.append(f"Variant {n}: choose a strategy among {', '.join(s.value for s in Strategy)}.")
            continue
        numbers: dict[str, int] = {}
        for key, default in (("workers", 1), ("ps", 0), ("devices_per_worker", 1)):
            value = item.get(key, default)
            spec = job_fields.BY_NAME[key]
            if isinstance(value, bool) or not isinstance(value, int) or not (spec.min or 0) <= value <= (spec.max or 0):
                problems.append(f"Variant {n}: {key} must be a whole number from {spec.min:g} to {spec.max:g}.")
                break
            numbers[key] = value
        else:
            variants.append(Variant(strategy=str(strategy), **numbers))
    if problems:
        raise ExperimentInvalid(("variants", p) for p in problems)
    check_count(variants)
    return variants


def check_count(variants: Sequence[Variant]) -> None:
    """From MIN_VARIANTS to MAX_VARIANTS variants, each once."""
    if not MIN_VARIANTS <= len(variants) <= MAX_VARIANTS:
        raise ExperimentInvalid(
            [("variants", f"Choose from {MIN_VARIANTS} to {MAX_VARIANTS} variants ({len(variants)} given).")]
        )
    labels = [v.label for v in variants]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ExperimentInvalid([("variants", f"Each variant once: {', '.join(twice)} is given more than once.")])


def template_of(job: Job) -> dict[str, Any]:
    """What every run shares, from an unsaved, validated job (program, hyperparameters, resilience settings)."""
    return {
        **{name: getattr(job, name) for name in _COMMON_FIELDS},
        "program_kind": job.program_kind,
        "builtin": job.builtin,
        "builtin_config": job.builtin_config,
        "args": job.args,
        "env": job.env,
        "script": job.script_id,
        # The class by name, checked again as each run is submitted (a right staff withdrew meanwhile is not used).
        "priority": getattr(job, "asked_priority", "") or "",
    }


def job_for(experiment: Experiment, variant: Mapping[str, Any]) -> Job:
    """The unsaved job of one variant."""
    template = dict(experiment.template)
    script = template.pop("script", None)
    priority = template.pop("priority", "")  # absent from experiments stored before classes were rights: the default
    job = Job(
        owner_id=experiment.owner_id,
        cluster_id=experiment.cluster_id,
        name=f"{experiment.name} · {variant['label']}"[: job_fields.MAX_NAME_CHARS],
        experiment=experiment,
        variant=variant["label"],
        script_id=script,
        **template,
        **{k: variant[k] for k in VARIANT_SHAPE},
    )
    job.asked_priority = priority  # type: ignore[attr-defined] # resolved and checked by submission.validate()
    return job


def create(
    *,
    base: Job,
    upload: submission.Upload | None,
    variants: Sequence[Variant],
    mode: str = ExperimentMode.SEQUENTIAL,
    target_accuracy: float = 0.9,
) -> Experiment:
    """Check every variant as its own job would be checked, then store the experiment and submit what its mode starts
    with. `base` is an unsaved job (owner, cluster, name, program, hyperparameters); its shape is ignored."""
    check_count(variants)
    if mode not in ExperimentMode.values:
        raise ExperimentInvalid([("mode", f"Choose one of: {', '.join(ExperimentMode.values)}.")])
    if not 0 < target_accuracy <= 1:
        raise ExperimentInvalid([("target_accuracy", "The target accuracy is a fraction above 0, at most 1.")])
    problems: list[str] = []
    common: list[tuple[str, str]] = []  # the program's problems, the same under every variant: once, on their field
    for variant in variants:
        probe = _probe(base, variant)
        try:
            submission.validate(probe, upload)
        except submission.JobInvalid as exc:
            for field, message in exc.pairs:
                if field in (*VARIANT_SHAPE, "non_field_errors"):
                    problems.append(f"{variant.label}: {message}")
                elif (field, message) not in common:
                    common.append((field, message))
    if common:
        raise ExperimentInvalid(common)
    if problems:
        raise ExperimentInvalid(("variants", p) for p in problems)
    if mode == ExperimentMode.PARALLEL:
        # Side by side only where the cluster has room for every variant at once (else they would run one after
        # another anyway, behind each other in the queue, and say nothing of it).
        crowded = job_plans.fits_together([_probe(base, v) for v in variants], base.cluster)
        if crowded:
            raise ExperimentInvalid(
                [
                    (
                        "mode",
                        f"These variants cannot run side by side on cluster {base.cluster.name}, even idle "
                        f"({crowded} once the others are placed); run them one after another.",
                    )
                ]
            )
    needed = 1 if mode == ExperimentMode.SEQUENTIAL else len(variants)
    with transaction.atomic():
        active = submission.lock_owner_and_count_active(base.owner_id)
        if needed == 1:
            problem = limits.active_jobs_problem(active)
            if problem:
                raise ExperimentInvalid(
                    [("non_field_errors", f"This experiment cannot queue its first run: {problem}")]
                )
        else:
            problem = limits.jobs_at_once_problem(active, needed)
            if problem:
                raise ExperimentInvalid(
                    [
                        (
                            "non_field_errors",
                            f"This experiment cannot queue all {needed} variants side by side: {problem} Run them "
                            "one after another (one job at a time), or wait for jobs to end.",
                        )
                    ]
                )
        if upload is not None:
            base.script = submission.store_script(upload)
        experiment = Experiment.objects.create(
            owner_id=base.owner_id,
            cluster_id=base.cluster_id,
            name=base.name,
            mode=mode,
            template=template_of(base),
            variants=[v.as_dict() for v in variants],
            target_accuracy=target_accuracy,
        )
    advance(experiment.pk)
    experiment.refresh_from_db()
    return experiment


def _probe(base: Job, variant: Variant) -> Job:
    """The unsaved job of `variant`, to check: `base` with the variant's strategy and shape."""
    probe = copy.copy(base)
    probe.variant = variant.label
    for key in VARIANT_SHAPE:
        setattr(probe, key, getattr(variant, key))
    return probe


def advance(experiment_id: int) -> list[int]:
    """Submit the runs the experiment's mode allows now; returns the ids of jobs submitted. Safe to call any time."""
    submitted: list[int] = []
    with transaction.atomic():
        experiment = Experiment.objects.select_for_update().filter(pk=experiment_id).first()
        if experiment is None or not experiment.pending:
            return submitted
        if experiment.cancelled_at is not None:
            experiment.pending = False
            experiment.save(update_fields=["pending"])
            return submitted
        runs = dict(experiment.jobs.values_list("variant", "state"))
        waiting = [v for v in experiment.variants if v["label"] not in runs]
        if not waiting:
            experiment.pending = False
            experiment.save(update_fields=["pending"])
            return submitted
        active = any(state not in TERMINAL_JOB_STATES for state in runs.values())
        batch = waiting if experiment.mode == ExperimentMode.PARALLEL else ([] if active else waiting[:1])
        for variant in batch:
            job = job_for(experiment, variant)
            try:
                submission.validate(job, None)
            except submission.JobInvalid as exc:
                # It can never run (the cluster changed since): the variant ends failed, saying why, and the
                # experiment goes on with the next.
                job.state, job.finished_at = JobState.FAILED, timezone.now()
                job.reason = "; ".join(message for _field, message in exc.pairs)
                job.save()
                submitted.append(job.pk)
                continue
            try:
                with transaction.atomic():
                    submission.submit(job, None)
            except submission.JobInvalid as exc:
                # The per-user limit (the person's other jobs took the places): tried again on the next pass.
                log.info("experiment %s waits to submit %s: %s", experiment.pk, variant["label"], exc.errors)
                break
            submitted.append(job.pk)
        if len(batch) == len(waiting) and len(submitted) == len(batch):
            experiment.pending = False
            experiment.save(update_fields=["pending"])
    return submitted


def advance_all(cluster_id: int | None = None) -> list[int]:
    """`advance` every experiment with a variant still without a job (of one cluster, or all)."""
    pending = Experiment.objects.filter(pending=True)
    if cluster_id is not None:
        pending = pending.filter(cluster_id=cluster_id)
    submitted: list[int] = []
    for experiment_id in pending.order_by("pk").values_list("pk", flat=True):
        submitted += advance(experiment_id)
    return submitted


def cancel(experiment_id: int, by: str) -> bool:
    """Cancel the experiment as a whole: its queued and running jobs are cancelled and no further one starts.
    Returns False when it had already ended."""
    with transaction.atomic():
        experiment = Experiment.objects.select_for_update().get(pk=experiment_id)
        if state_of(experiment) in TERMINAL_JOB_STATES:
            return False
        experiment.cancelled_at = timezone.now()
        experiment.pending = False
        experiment.save(update_fields=["cancelled_at", "pending"])
        job_ids = list(experiment.jobs.exclude(state__in=TERMINAL_JOB_STATES).values_list("pk", flat=True))
    for job_id in job_ids:
        lifecycle.cancel(job_id, by=f"{by} (experiment #{experiment_id} cancelled)")
    return True


def state_of(experiment: Experiment, jobs: Sequence[Job] | None = None) -> str:
    """Derived from its jobs: running while a variant has not ended (or not started), then succeeded (every variant
    succeeded), failed (some did not) or cancelled (cancelled by its owner)."""
    if experiment.cancelled_at is not None:
        return "cancelled"  # its jobs were cancelled with it (lifecycle.cancel ends a job at once)
    states = {j.variant: j.state for j in (jobs if jobs is not None else experiment.jobs.all())}
    ended = all(states.get(v["label"]) in TERMINAL_JOB_STATES for v in experiment.variants)
    if not ended:
        return "running" if states else "queued"
    return "succeeded" if all(s == JobState.SUCCEEDED for s in states.values()) else "failed"


def script_of(experiment: Experiment) -> Script | None:
    sha = experiment.template.get("script")
    return Script.objects.filter(pk=sha).first() if sha else None
