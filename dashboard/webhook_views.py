"""The webhooks page: register a receiver (its secret shown once, in the answer to the form), see each hook's
delivery log, delete one. The rules are orchestrator/webhooks/hooks.py's, as for the API."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from orchestrator.models import Cluster, Webhook
from orchestrator.models.webhooks import DEFAULT_EVENTS, notable_states
from orchestrator.webhooks import hooks

LOG_ROWS = 20


@require_http_methods(["GET", "POST"])
def webhooks(request: HttpRequest) -> HttpResponse:
    created: Webhook | None = None
    secret = ""
    errors: hooks.Errors = {}
    form = {"url": "", "name": "", "events": [str(e) for e in DEFAULT_EVENTS], "cluster": "", "allow_private": False}
    if request.method == "POST":
        cluster_name = request.POST.get("cluster", "")
        form = {
            "url": request.POST.get("url", "").strip()[:2100],
            "name": request.POST.get("name", "").strip()[:100],
            "events": request.POST.getlist("events"),
            "cluster": cluster_name,
            "allow_private": request.POST.get("allow_private") == "on",
        }
        cluster = Cluster.objects.filter(name=cluster_name).first() if cluster_name else None
        if cluster_name and cluster is None:
            errors["cluster"] = ["No such cluster."]
        else:
            created, secret, errors = hooks.create(
                request.user, str(form["url"]), events=list(form["events"]), cluster=cluster,
                allow_private=bool(form["allow_private"]), name=str(form["name"]),
            )  # fmt: skip
    mine = list(Webhook.objects.filter(owner=request.user).select_related("cluster"))
    logs = {hook.pk: list(hook.deliveries.all()[:LOG_ROWS]) for hook in mine}
    return render(
        request,
        "dashboard/webhooks.html",
        {
            "hooks": [(hook, logs[hook.pk]) for hook in mine],
            "created": created,
            "secret": secret,
            "errors": errors,
            "form": form,
            "states": notable_states(),
            "clusters": list(Cluster.objects.order_by("name").values_list("name", flat=True)),
        },
        status=400 if errors else 200,
    )


@require_POST
def webhook_delete(request: HttpRequest, webhook_id: int) -> HttpResponse:
    hook = get_object_or_404(Webhook, pk=webhook_id, owner=request.user)
    hook.delete()
    messages.info(request, f"Webhook {hook} deleted.")
    return redirect("dashboard:webhooks")
