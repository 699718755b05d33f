"""The experiments pages: the list, an experiment's page and its live part (per variant the numbers, curves and
verdict), cancelling one and setting its target accuracy."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from dashboard.experiment_page import experiment_rows
from dashboard.job_views import JOB_LIST_LIMIT
from orchestrator.experiments import actions as experiments
from orchestrator.experiments import summary as experiment_summary
from orchestrator.models import TERMINAL_JOB_STATES, Experiment


def _experiment_for(request: HttpRequest, experiment_id: int) -> Experiment:
    return get_object_or_404(Experiment.objects.visible_to(request.user), pk=experiment_id)


@require_GET
def experiment_list(request: HttpRequest) -> HttpResponse:
    """The person's experiments (staff: everyone's), newest first, each with its state and verdict."""
    shown = list(Experiment.objects.visible_to(request.user).order_by("-pk")[: JOB_LIST_LIMIT + 1])
    rows = [(e, experiments.state_of(e)) for e in shown[:JOB_LIST_LIMIT]]
    return render(
        request,
        "dashboard/experiments.html",
        {"rows": rows, "truncated": len(shown) > JOB_LIST_LIMIT, "limit": JOB_LIST_LIMIT},
    )


def _experiment_context(request: HttpRequest, experiment_id: int) -> dict[str, Any]:
    experiment = _experiment_for(request, experiment_id)
    summary = experiment_summary.summarize(experiment)
    return {
        "experiment": experiment,
        "summary": summary,
        "rows": experiment_rows(summary),
        "jobs": list(experiment.jobs.order_by("pk")),
        "ended": summary["state"] in TERMINAL_JOB_STATES,
        "script": experiments.script_of(experiment),
    }


@require_GET
def experiment_detail(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """The experiment page: per variant the numbers, the curves and the verdict (the API's `summary`, the same dict);
    its live part follows the runs until the experiment ends (experiment_summary)."""
    return render(request, "dashboard/experiment.html", _experiment_context(request, experiment_id))


@require_GET
def experiment_live(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """The experiment page's live part alone (state, verdict, table, chart data), polled while it runs."""
    return render(request, "dashboard/_experiment_live.html", _experiment_context(request, experiment_id))


@require_POST
def experiment_cancel(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment_for(request, experiment_id)
    if experiments.cancel(experiment.pk, by=request.user.get_username()):
        messages.info(request, "Cancelled: its queued and running jobs are cancelled, and no further one starts.")
    else:
        messages.info(request, f"The experiment had already ended ({experiments.state_of(experiment)}).")
    return redirect(experiment)


@require_POST
def experiment_target(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """A new target accuracy: stored, so the page and the API keep showing the same numbers."""
    experiment = _experiment_for(request, experiment_id)
    try:
        target = float(request.POST.get("target_accuracy", ""))
    except ValueError:
        target = -1.0
    if not 0 < target <= 1:
        messages.error(request, "The target accuracy is a fraction above 0, at most 1 (e.g. 0.9).")
    else:
        Experiment.objects.filter(pk=experiment.pk).update(target_accuracy=target)
    return redirect(experiment)
