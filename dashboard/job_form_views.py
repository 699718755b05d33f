"""The new-job form: a new job or "run again" from an earlier one (`?from=<id>`), its preview (placement and every
task's TF_CONFIG, nothing saved), its calculator, and "Compare strategies", which starts an experiment from it."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from contracts.programs import BUILTIN_PROGRAMS
from contracts.run_config import PROGRAM_KEYS, SCRIPT_ENV
from dashboard import calculator
from dashboard.forms import (
    CONFIG_FIELDS,
    SCRIPT,
    SECTIONS,
    ClusterGuidance,
    ExperimentOptionsForm,
    JobForm,
    cluster_guidance,
    default_shape,
    initial_from,
    shape_for,
)
from dashboard.job_views import job_for
from orchestrator.experiments import actions as experiments
from orchestrator.models import Cluster, Experiment, Job, ProgramKind, Strategy
from orchestrator.submit import submission


@require_http_methods(["GET", "POST"])
def job_new(request: HttpRequest) -> HttpResponse:
    source = _clone_source(request)  # `?from=<id>`: "run again"; the form posts back to the same URL
    guidance = [cluster_guidance(c) for c in Cluster.objects.prefetch_related("hosts")]
    initial = initial_from(source) if source else _new_initial(request, guidance)
    form = JobForm(request.POST or None, request.FILES or None, initial=initial, user=request.user)
    comparing = request.method == "POST" and "compare" in request.POST
    options = ExperimentOptionsForm(request.POST if comparing else None)
    if comparing:
        experiment = _new_experiment(request, form, options, source)
        if experiment is not None:
            return redirect(experiment)
    elif request.method == "POST" and form.is_valid():
        try:
            job, upload = form.build(request.user)
            if source is not None and upload is None:
                _run_program_of(source, job, chosen=form.chose_program())
            submission.submit(job, upload)
        except submission.JobInvalid as exc:
            form.add_job_errors(exc.pairs)
        else:
            return redirect(job)
    if source is not None:
        messages.info(request, _clone_note(source))
    context = _job_form_context(form, guidance, plan=None)
    return render(request, "dashboard/job_new.html", {**context, "options": options, "comparing": comparing})


def _new_experiment(
    request: HttpRequest, form: JobForm, options: ExperimentOptionsForm, source: Job | None
) -> Experiment | None:
    """ "Compare strategies": the form's program and hyperparameters under each chosen variant. None (with the
    errors on the forms) when it cannot start."""
    if not (form.is_valid() & options.is_valid()):  # both validated, so every error shows at once
        return None
    try:
        base, upload = form.build(request.user)
        if source is not None and upload is None:
            _run_program_of(source, base, chosen=form.chose_program())
        return experiments.create(
            base=base,
            upload=upload,
            variants=options.chosen_variants(),
            mode=options.cleaned_data["experiment_mode"],
            target_accuracy=options.cleaned_data["target_accuracy"],
        )
    except submission.JobInvalid as exc:
        for field, message in exc.pairs:
            if field in options.fields:
                options.add_error(field, message)
            elif field == "mode":
                options.add_error("experiment_mode", message)
            else:
                form.add_job_errors([(field, message)])
        return None


def _new_initial(request: HttpRequest, guidance: list[ClusterGuidance]) -> dict[str, Any]:
    """A new form opens valid: the first cluster's suggested strategy and its shape, or (`?strategy=`, e.g. from a
    link) the asked strategy's starting shape."""
    first = guidance[0] if guidance else None
    asked = request.GET.get("strategy", "")
    shape = shape_for(asked, first) if asked in Strategy.values else default_shape(first)
    return {**shape, **({"cluster": first.cluster_id} if first else {})}


def _clone_source(request: HttpRequest) -> Job | None:
    value = request.GET.get("from")
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or int(value) > 2**31 - 1:
        raise Http404("No such job to run again")
    return job_for(request, int(value))


def _run_program_of(source: Job, job: Job, *, chosen: bool) -> None:
    """The rerun runs what `source` ran: its stored script (content-addressed, so the very same file) or built-in
    program and configuration, unless the form chose another. A post without the Program choice (an older page)
    runs the source's program as it was; "My script" with no file and no earlier script runs the source's script."""
    if chosen:
        if job.program_kind == ProgramKind.SCRIPT and job.script_id is None and source.script_id is not None:
            job.script = source.script
        if job.builtin and job.builtin == source.builtin:
            # Keys the form has no field for (seed, momentum, steps_per_epoch... set through the API) carry over.
            kept = {k: v for k, v in (source.builtin_config or {}).items() if k not in CONFIG_FIELDS}
            job.builtin_config = {**kept, **job.builtin_config}
        return
    job.program_kind = source.program_kind
    job.script = source.script
    job.builtin = source.builtin
    job.builtin_config = source.builtin_config


def _clone_note(source: Job) -> str:
    prefix = f"Filled in from job #{source.pk} ({source.name}): choose another strategy or shape and launch."
    if source.program_kind == ProgramKind.BUILTIN:
        return f"{prefix} It runs the built-in program {source.builtin} with the same configuration again."
    if source.script is not None:
        return (
            f"{prefix} It runs the same script, {source.script.filename} ({source.script.sha256[:12]}), again "
            "unless you choose another file."
        )
    return f"{prefix} Choose the script to run."


@require_POST
def job_preview(request: HttpRequest) -> HttpResponse:
    """The placement and every task's TF_CONFIG the form would get, saving nothing: the same validation as the API's
    `plan` action (no program needed, an uploaded script is still checked). The whole page comes back; htmx takes
    the plan and each field's error slot out of it, so the inputs (a chosen file included) stay as they are."""
    form = JobForm(request.POST, request.FILES or None, user=request.user)
    guidance = [cluster_guidance(c) for c in Cluster.objects.prefetch_related("hosts")]
    plan = None
    if form.is_valid():
        try:
            job, upload = form.build(request.user)
            submission.validate(job, upload, require_program=False)
        except submission.JobInvalid as exc:
            form.add_job_errors(exc.pairs)
        else:
            plan = submission.describe_plan(job)
            for task in plan["tasks"]:
                # As the task's environment gets it; None for a Mirrored run, which needs none.
                task["tf_config_json"] = None if task["tf_config"] is None else json.dumps(task["tf_config"])
    return render(request, "dashboard/job_new.html", _job_form_context(form, guidance, plan=plan, previewed=True))


def _job_form_context(
    form: JobForm, guidance: list[ClusterGuidance], *, plan: dict[str, Any] | None, previewed: bool = False
) -> dict[str, Any]:
    return {
        "form": form,
        "plan": plan,
        "previewed": previewed,
        "guidance": guidance,
        "sections": [(title, [form[name] for name in names]) for title, names in SECTIONS],
        "programs": BUILTIN_PROGRAMS,
        "script_choice": SCRIPT,
        "script_env": SCRIPT_ENV,
        "page_rules": {
            # Which fields show for which program, and each strategy's starting shape per cluster: the page's
            # script switches them; the rules themselves are contracts/run_config.py's and forms.shape_for's.
            "program_keys": PROGRAM_KEYS,
            "shapes": {g.cluster_id: {s: shape_for(s, g) for s in Strategy.values} for g in guidance},
        },
        "error_slots": ",".join(["#errors-form", *(f"#errors-{name}" for name in form.fields)]),
    }


@require_GET
def job_calc(request: HttpRequest) -> HttpResponse:
    """The calculator's figures for the form's values as typed (htmx asks on every change)."""
    return render(request, "dashboard/_calc.html", {"calc": calculator.calculate(request.GET)})
