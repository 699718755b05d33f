from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.db.models import Prefetch
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dashboard.forms import JobForm, cluster_guidance
from orchestrator import jobs, lifecycle
from orchestrator.api.job_views import jobs_visible_to
from orchestrator.models import Cluster, Host, Job, Task
from worker_agent.runtime.config import RunConfig


def _clusters_with_hosts() -> list[Cluster]:
    return list(Cluster.objects.prefetch_related(Prefetch("hosts", queryset=Host.objects.order_by("name"))))


def _job_for(request: HttpRequest, job_id: int) -> Job:
    return get_object_or_404(jobs_visible_to(request.user), pk=job_id)


@require_GET
def clusters(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "dashboard/clusters.html",
        {"clusters": _clusters_with_hosts(), "heartbeat_timeout": settings.TFDASH_HEARTBEAT_TIMEOUT_S},
    )


@require_GET
def host_rows(request: HttpRequest) -> HttpResponse:
    """The host tables alone: htmx swaps them in every few seconds so statuses stay live."""
    return render(request, "dashboard/_host_tables.html", {"clusters": _clusters_with_hosts()})


@require_GET
def job_list(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/jobs.html", {"jobs": jobs_visible_to(request.user)[:200]})


@require_http_methods(["GET", "POST"])
def job_new(request: HttpRequest) -> HttpResponse:
    form = JobForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        try:
            job, upload = form.build(request.user)
            jobs.submit(job, upload)
        except jobs.JobInvalid as exc:
            form.add_job_errors(exc.errors)
        else:
            return redirect(job)
    return render(request, "dashboard/job_new.html", _job_form_context(form, plan=None))


@require_POST
def job_preview(request: HttpRequest) -> HttpResponse:
    """The placement and every task's TF_CONFIG the form would get, saving nothing: the same validation as the API's
    `plan` action (no program needed, an uploaded script is still checked). The whole page comes back; htmx takes
    the plan and each field's error slot out of it, so the inputs (a chosen file included) stay as they are."""
    form = JobForm(request.POST, request.FILES or None)
    plan = None
    if form.is_valid():
        try:
            job, upload = form.build(request.user)
            jobs.validate(job, upload, require_program=False)
        except jobs.JobInvalid as exc:
            form.add_job_errors(exc.errors)
        else:
            plan = jobs.describe_plan(job)
            for task in plan["tasks"]:
                # As the task's environment gets it; None for a Mirrored run, which needs none.
                task["tf_config_json"] = None if task["tf_config"] is None else json.dumps(task["tf_config"])
    return render(request, "dashboard/job_new.html", _job_form_context(form, plan=plan, previewed=True))


def _job_form_context(form: JobForm, *, plan: dict[str, Any] | None, previewed: bool = False) -> dict[str, Any]:
    defaults = RunConfig(program="synthetic")
    return {
        "form": form,
        "plan": plan,
        "previewed": previewed,
        "guidance": [cluster_guidance(c) for c in Cluster.objects.prefetch_related("hosts")],
        "error_slots": ",".join(["#errors-form", *(f"#errors-{name}" for name in form.fields)]),
        # The built-in programs' defaults, so the calculator starts where a run without a config would.
        "calc": {
            "per_replica_batch": defaults.per_replica_batch,
            "learning_rate": defaults.learning_rate,
            "scale_lr": defaults.scale_lr,
            "warmup_epochs": defaults.warmup_epochs,
            "examples": defaults.examples,
            "epochs": defaults.epochs,
        },
    }


@require_GET
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_for(request, job_id)
    return render(request, "dashboard/job.html", {"job": job, "task_names": _task_names(job), **_job_parts(job)})


@require_GET
def job_live(request: HttpRequest, job_id: int) -> HttpResponse:
    """State, reason and task table alone, refreshed by htmx while the job runs."""
    job = _job_for(request, job_id)
    return render(request, "dashboard/_job_live.html", {"job": job, **_job_parts(job)})


def _task_names(job: Job) -> dict[int, str]:
    """What the charts call each task the job ever ran (metric points name tasks by id), earlier placements marked."""
    return {
        pk: f"{kind} {index}" + ("" if attempt == job.attempt else f" (placement {attempt})")
        for pk, kind, index, attempt in job.tasks.values_list("pk", "type", "index", "attempt")
    }


def _job_parts(job: Job) -> dict[str, object]:
    failed = job.failed_task
    tasks = list(job.current_tasks())
    has_metrics = job.metric_points.exists()
    ran = any(t.started_at for t in tasks)
    return {
        "tasks": tasks,
        "failure_tail": failed.log_tail() if failed else [],
        "artifacts": list(job.artifacts.order_by("name").values("name", "size")),
        "has_metrics": has_metrics,
        # Said only once the job has run a while: a script that neither calls model.fit nor report() sends nothing.
        "reports_no_metrics": ran and not has_metrics and (job.is_terminal or job.state == "running"),
    }


@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_for(request, job_id)
    if lifecycle.cancel(job.pk, by=request.user.get_username()):
        messages.info(request, "Cancelled: every process of the job is being stopped.")
    else:
        messages.info(request, f"The job had already {job.state}.")
    return redirect(job)


@require_GET
def task_log(request: HttpRequest, job_id: int, task_id: int) -> HttpResponse:
    job = _job_for(request, job_id)
    task = Task.objects.filter(pk=task_id, job=job).select_related("host").first()
    if task is None:
        raise Http404("No such task in this job")
    lines = list(task.log_lines.order_by("seq").values_list("stream", "text"))
    return render(request, "dashboard/task_log.html", {"job": job, "task": task, "lines": lines})
