"""The queue page (like `squeue --start`), each priority class's rule, and staff's actions on it: hold, release,
another priority class."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from orchestrator.models import Cluster, Job, PriorityClass
from orchestrator.scheduler import class_rights, queue_view


def queue(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_object_or_404(Cluster, pk=cluster_id)
    return render(
        request,
        "dashboard/queue.html",
        {
            "cluster": cluster,
            "rows": queue_view.rows(cluster, request.user),
            "classes": list(PriorityClass.objects.values_list("name", flat=True)),
            "class_rules": class_rights.rules(request.user),
        },
    )


@require_POST
def queue_action(request: HttpRequest, cluster_id: int, job_id: int, action: str) -> HttpResponse:
    if not request.user.is_staff:
        raise PermissionDenied("Only staff may change the queue.")
    job = get_object_or_404(Job, pk=job_id, cluster_id=cluster_id)
    by = request.user.get_username()
    try:
        if action == "hold":
            queue_view.hold(job.pk, by)
        elif action == "release":
            queue_view.release(job.pk, by)
        elif action == "priority":
            queue_view.set_priority(job.pk, request.POST.get("priority", "")[:64], by)
        else:
            raise Http404("No such queue action")
    except queue_view.QueueActionRefused as exc:
        messages.error(request, str(exc))
    return redirect("dashboard:queue", cluster_id=cluster_id)
