"""A person's jobs: the list (filtered by state, strategy, owner and name), finished jobs side by side, the job page and
its parts for a page without JavaScript (state, task table, log tail), cancelling, and a task's whole log."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.utils.html import escape
from django.views.decorators.http import require_GET, require_POST

from dashboard import compare, job_rows, page_data
from orchestrator.jobs import lifecycle
from orchestrator.metrics import log_reader
from orchestrator.models import TERMINAL_JOB_STATES, Job, JobState, Strategy, Task


def job_for(request: HttpRequest, job_id: int) -> Job:
    return get_object_or_404(Job.objects.visible_to(request.user), pk=job_id)


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


@require_GET
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    """The job page; its socket (dashboard/consumers.py) then keeps state, tasks, log tail and charts live."""
    job = job_for(request, job_id)
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
    job = job_for(request, job_id)
    return render(request, "dashboard/_job_live.html", {"job": job, **page_data.job_parts(job)})


@require_GET
def job_log_tail(request: HttpRequest, job_id: int) -> HttpResponse:
    """The log panel alone for one task (`?task=`, else the first of the current placement): for a page without
    JavaScript; the job page itself gets new lines over its socket."""
    job = job_for(request, job_id)
    try:
        chosen = int(request.GET.get("task", ""))
    except ValueError:
        chosen = None
    return render(request, "dashboard/_task_log_tail.html", {"job": job, **page_data.log_tail(job, None, chosen)})


@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = job_for(request, job_id)
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
    job = job_for(request, job_id)
    task = Task.objects.filter(pk=task_id, job=job).select_related("host").first()
    if task is None:
        raise Http404("No such task in this job")
    page = render_to_string("dashboard/task_log.html", {"job": job, "task": task, "log_slot": _LOG_SLOT}, request)
    head, _slot, tail = page.partition(_LOG_SLOT)
    # Each line as a terminal shows it (a progress bar at its last state); the raw text is the download's `?raw=1`.
    body = log_reader.chunks(task.pk, _log_html, head=head, empty="No output yet.", tail=tail)
    return log_reader.streaming(body, "text/html; charset=utf-8")


def _log_html(lines: list[log_reader.Line]) -> str:
    return "".join(f'<span class="{escape(stream)}">{escape(text)}</span>\n' for _seq, stream, text in lines)
