"""An experiment's summary: per variant what its run measured (orchestrator/metrics/runs.py, the numbers the job
comparison shows too), the derived figures and the verdict (orchestrator/core/verdict.py). The experiment page and
`/api/experiments/<id>/` both render this one dict, so they show the same numbers."""

from __future__ import annotations

from typing import Any

from contracts.strategies import STRATEGY_LABELS, Strategy
from orchestrator import limits
from orchestrator.core import verdict
from orchestrator.experiments.actions import state_of
from orchestrator.metrics.runs import METRICS, JobRun, chart_data, load_runs
from orchestrator.models import TERMINAL_JOB_STATES, Experiment, ExperimentMode, Host, Job, Task

NOT_STARTED = "not started"


def summarize(experiment: Experiment) -> dict[str, Any]:
    jobs = list(Job.objects.filter(experiment=experiment).order_by("pk"))
    by_variant = {job.variant: job for job in jobs}
    runs = {run.job.pk: run for run in load_runs(jobs)}
    target = experiment.target_accuracy

    results: list[verdict.VariantResult] = []
    rows: list[dict[str, Any]] = []
    for variant in experiment.variants:
        job = by_variant.get(variant["label"])
        run = runs.get(job.pk) if job is not None else None
        result = _result(variant, job, run, target)
        results.append(result)
        rows.append(_row(variant, job, run, result))
    baseline = next((r for r in results if r.baseline and r.state == verdict.SUCCEEDED), None)
    for row, result in zip(rows, results, strict=True):
        efficiency = None
        if baseline is not None and not result.baseline:
            efficiency = verdict.scaling_efficiency(result.examples_per_s, result.replicas, baseline.examples_per_s)
        row["scaling_efficiency"] = efficiency

    waiting = _why_waiting(experiment, jobs)
    for row in rows:
        if row["job"] is None:
            row["reason"] = waiting

    hosts, gpus = _hosts_used(jobs)
    return {
        "state": state_of(experiment, jobs),
        "target_accuracy": target,
        "hosts_used": hosts,
        "variants": rows,
        "verdict": verdict.verdict(results, target, hosts=hosts, gpus=gpus),
        "charts": _charts([runs[j.pk] for j in jobs if j.pk in runs]),
    }


def _result(variant: dict[str, Any], job: Job | None, run: JobRun | None, target: float) -> verdict.VariantResult:
    replicas = verdict.replicas_of(variant["strategy"], variant["workers"], variant["devices_per_worker"])
    baseline = verdict.is_baseline(
        variant["strategy"], variant["workers"], variant["ps"], variant["devices_per_worker"]
    )
    if job is None or run is None:
        return verdict.VariantResult(variant["label"], variant["strategy"], replicas, NOT_STARTED, baseline=baseline)
    reached = verdict.time_to_target([(e.number, e.elapsed_s, e.values.get("accuracy")) for e in run.epochs], target)
    return verdict.VariantResult(
        label=variant["label"],
        strategy=variant["strategy"],
        replicas=replicas,
        state=job.state,
        mean_epoch_s=run.mean_epoch_s,
        examples_per_s=run.examples_per_s,
        final_loss=run.final.get("loss"),
        final_accuracy=run.final.get("accuracy"),
        time_to_target_s=reached[1] if reached else None,
        epochs_to_target=reached[0] if reached else None,
        reason=job.reason if job.state != verdict.SUCCEEDED else "",
        baseline=baseline,
    )


def _row(variant: dict[str, Any], job: Job | None, run: JobRun | None, r: verdict.VariantResult) -> dict[str, Any]:
    return {
        "label": variant["label"],
        "strategy": variant["strategy"],
        "strategy_label": STRATEGY_LABELS[Strategy(variant["strategy"])],
        "workers": variant["workers"],
        "ps": variant["ps"],
        "devices_per_worker": variant["devices_per_worker"],
        "replicas": r.replicas,
        "baseline": r.baseline,
        "job": job.pk if job is not None else None,
        "state": r.state,
        "reason": job.reason if job is not None else "",
        "epochs": len(run.epochs) if run is not None else 0,
        "mean_epoch_s": r.mean_epoch_s,
        "run_s": run.run_s if run is not None else None,
        "examples_per_s": r.examples_per_s,
        "final_loss": r.final_loss,
        "final_accuracy": r.final_accuracy,
        "time_to_target_s": r.time_to_target_s,
        "epochs_to_target": r.epochs_to_target,
    }


def _charts(runs: list[JobRun]) -> dict[str, Any]:
    reported = {name for run in runs for epoch in run.epochs for name in epoch.values}
    metrics = [m for m in METRICS if m in reported]
    return chart_data(runs, metrics, lambda run: f"{run.job.variant} (#{run.job.pk})")


def _hosts_used(jobs: list[Job]) -> tuple[int, bool]:
    """How many hosts ran a task of the experiment, and whether any of them has GPUs."""
    host_ids = set(Task.objects.filter(job__in=jobs, host__isnull=False).values_list("host_id", flat=True))
    gpus = any(h.gpus for h in Host.objects.filter(pk__in=host_ids).only("gpus"))
    return max(1, len(host_ids)), gpus


def _why_waiting(experiment: Experiment, jobs: list[Job]) -> str:
    """Why a variant has no job yet, in words for its row."""
    if experiment.cancelled_at is not None:
        return "not run: the experiment was cancelled"
    if experiment.mode == ExperimentMode.SEQUENTIAL and any(not j.is_terminal for j in jobs):
        return "waits for the run before it to end"
    active = Job.objects.filter(owner_id=experiment.owner_id).exclude(state__in=TERMINAL_JOB_STATES).count()
    problem = limits.active_jobs_problem(active)
    return f"waits for a place: {problem}" if problem else "submitted on the control loop's next pass"
