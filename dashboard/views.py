from __future__ import annotations

import json
from typing import Any

import redis
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.db.models import Prefetch, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.utils.html import escape
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from contracts.programs import BUILTIN_PROGRAMS
from contracts.run_config import PROGRAM_KEYS, SCRIPT_ENV
from dashboard import calculator, compare, job_rows, page_data
from dashboard.experiment_page import experiment_rows
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
from orchestrator.experiments import actions as experiments
from orchestrator.experiments import summary as experiment_summary
from orchestrator.jobs import lifecycle
from orchestrator.metrics import log_reader
from orchestrator.metrics import stream as metrics_stream
from orchestrator.models import (
    TERMINAL_JOB_STATES,
    Cluster,
    Experiment,
    Host,
    Job,
    JobState,
    ProgramKind,
    Strategy,
    Task,
)
from orchestrator.plumbing import counters
from orchestrator.submit import submission


def _clusters_with_hosts() -> list[Cluster]:
    return list(Cluster.objects.prefetch_related(Prefetch("hosts", queryset=Host.objects.order_by("name"))))


def _job_for(request: HttpRequest, job_id: int) -> Job:
    return get_object_or_404(Job.objects.visible_to(request.user), pk=job_id)


@require_GET
def clusters(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "dashboard/clusters.html",
        {
            "clusters": page_data.cluster_rows(page=_page(request)),
            "heartbeat_timeout": settings.TFDASH_HEARTBEAT_TIMEOUT_S,
            "page": _page(request),
            "ingest_behind_s": _ingest_behind_s() if request.user.is_staff else None,
        },
    )


def _ingest_behind_s() -> float | None:
    """For the staff: how long the oldest unstored metric entry has waited, when the ingest is behind; else None."""
    try:
        waiting = metrics_stream.waiting_age_s(counters.client())
    except redis.RedisError:
        return None  # the page shows what it can; /metrics says Redis could not be read
    return waiting if metrics_stream.behind(waiting) else None


def _page(request: HttpRequest) -> int:
    """The hosts page asked for (page_data.HOSTS_PER_PAGE hosts per cluster table); 1 when none or not a number."""
    try:
        return max(1, int(request.GET.get("page", "1")))
    except ValueError:
        return 1


@require_GET
def host_rows(request: HttpRequest) -> HttpResponse:
    """The host tables alone: htmx swaps them in every few seconds so statuses, slots and load stay live."""
    return render(request, "dashboard/_host_tables.html", {"clusters": page_data.cluster_rows(page=_page(request))})


JOB_LIST_LIMIT = 200
FINISHED = "finished"  # the state filter's name for every terminal state: the jobs that can be compared


@require_GET
def job_list(request: HttpRequest) -> HttpResponse:
    """The person's jobs (staff: everyone's), filtered by state, strategy and owner; finished ones can be ticked and
    compared, and any can be run again through a pre-filled form."""
    shown, filters = _filter_jobs(request, Job.objects.visible_to(request.user))
    rows = list(shown[: JOB_LIST_LIMIT + 1])
    listed = job_rows.rows(rows[:JOB_LIST_LIMIT])
    if request.GET.get("rows"):  # the table's body alone: polled while a listed job is live
        return render(
            request,
            "dashboard/_job_rows.html",
            {"rows": listed, "filters": filters, "filtered": any(filters.values()), "live": job_rows.any_live(rows)},
        )
    owners: list[str] = []
    if request.user.is_staff:
        users = get_user_model().objects.filter(jobs__isnull=False).distinct().order_by("username")
        owners = list(users.values_list("username", flat=True))
    return render(
        request,
        "dashboard/jobs.html",
        {
            "jobs": rows[:JOB_LIST_LIMIT],
            "rows": listed,
            "live": job_rows.any_live(rows),
            "truncated": len(rows) > JOB_LIST_LIMIT,
            "limit": JOB_LIST_LIMIT,
            "filters": filters,
            "filtered": any(filters.values()),
            "state_choices": [(FINISHED, "finished (any end)"), *((s, s) for s in JobState.values)],
            "strategy_choices": Strategy.choices,
            "owners": owners,
            "terminal_states": [str(s) for s in TERMINAL_JOB_STATES],
        },
    )


def _filter_jobs(request: HttpRequest, visible: QuerySet[Job]) -> tuple[QuerySet[Job], dict[str, str]]:
    """`visible` narrowed by the query's state, strategy and owner; a value that is no choice is ignored."""
    state = request.GET.get("state", "")
    if state == FINISHED:
        visible = visible.filter(state__in=TERMINAL_JOB_STATES)
    elif state in JobState.values:
        visible = visible.filter(state=state)
    else:
        state = ""
    strategy = request.GET.get("strategy", "")
    if strategy in Strategy.values:
        visible = visible.filter(strategy=strategy)
    else:
        strategy = ""
    owner = request.GET.get("owner", "").strip()[:150]
    if owner:
        visible = visible.filter(owner__username=owner)  # within what the person may see anyway
    name = request.GET.get("q", "").strip()[:200]
    if name:
        visible = visible.filter(name__icontains=name)
    return visible, {"state": state, "strategy": strategy, "owner": owner, "q": name}


@require_GET
def job_compare(request: HttpRequest) -> HttpResponse:
    """Finished jobs side by side (`?ids=3&ids=5`): a refusal is a page that says why, never an error page."""
    try:
        ids = compare.parse_ids(request.GET.getlist("ids"))
        comparison = compare.compare(Job.objects.visible_to(request.user), ids)
    except compare.CannotCompare as exc:
        return render(request, "dashboard/compare.html", {"problem": str(exc)}, status=exc.status)
    return render(
        request,
        "dashboard/compare.html",
        {
            "comparison": comparison,
            "summary": comparison.summary(),
            "epoch_rows": comparison.epoch_rows(),
            "chart_data": comparison.chart_data(),
        },
    )


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
    return _job_for(request, int(value))


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


@require_GET
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    """The job page; its socket (dashboard/consumers.py) then keeps state, tasks, log tail and charts live."""
    job = _job_for(request, job_id)
    parts = page_data.job_parts(job)
    return render(
        request,
        "dashboard/job.html",
        {
            "job": job,
            "task_names": page_data.task_names(job),
            **parts,
            **page_data.log_tail(job, parts["tasks"], None),
            "log_tail_lines": page_data.LOG_TAIL_LINES,
        },
    )


@require_GET
def job_live(request: HttpRequest, job_id: int) -> HttpResponse:
    """State, reason, task table and facts alone, as the socket's `job` frames carry them: for a page without
    JavaScript, and the page's "may I still see this job?" probe when its socket cannot connect."""
    job = _job_for(request, job_id)
    return render(request, "dashboard/_job_live.html", {"job": job, **page_data.job_parts(job)})


@require_GET
def job_log_tail(request: HttpRequest, job_id: int) -> HttpResponse:
    """The log panel alone for one task (`?task=`, else the first of the current placement): for a page without
    JavaScript; the job page itself gets new lines over its socket."""
    job = _job_for(request, job_id)
    try:
        chosen = int(request.GET.get("task", ""))
    except ValueError:
        chosen = None
    return render(request, "dashboard/_task_log_tail.html", {"job": job, **page_data.log_tail(job, None, chosen)})


@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_for(request, job_id)
    if lifecycle.cancel(job.pk, by=request.user.get_username()):
        messages.info(request, "Cancelled: every process of the job is being stopped.")
    else:
        messages.info(request, f"The job had already {job.state}.")
    return redirect(job)


_LOG_SLOT = "\x00log-lines\x00"  # where the page's streamed lines go in the rendered template


@require_GET
def task_log(request: HttpRequest, job_id: int, task_id: int) -> HttpResponse:
    """The task's whole log as a page, streamed a page of lines at a time (metrics/log_reader.py): a log of any size
    costs the server one page of memory."""
    job = _job_for(request, job_id)
    task = Task.objects.filter(pk=task_id, job=job).select_related("host").first()
    if task is None:
        raise Http404("No such task in this job")
    page = render_to_string("dashboard/task_log.html", {"job": job, "task": task, "log_slot": _LOG_SLOT}, request)
    head, _slot, tail = page.partition(_LOG_SLOT)
    body = log_reader.chunks(task.pk, _log_html, head=head, empty="No output yet.", tail=tail)
    return log_reader.streaming(body, "text/html; charset=utf-8")


def _log_html(lines: list[log_reader.Line]) -> str:
    return "".join(f'<span class="{escape(stream)}">{escape(text)}</span>\n' for _seq, stream, text in lines)
