"""Staff's page of task environments (Django admin, staff only), and the host page's table of what its agent probed.
Saving or deleting an environment tells the cluster's agents at once (orders.py)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from orchestrator.environments import availability, orders
from orchestrator.models import Host, TaskEnvironment


@admin.register(TaskEnvironment)
class TaskEnvironmentAdmin(admin.ModelAdmin):
    list_display = ("name", "cluster", "interpreter", "labels", "is_default", "hosts_ok")
    list_filter = ("cluster",)
    search_fields = ("name", "interpreter", "labels")
    fields = ("cluster", "name", "interpreter", "labels", "is_default", "host_reports")
    readonly_fields = ("host_reports",)

    def save_model(self, request: HttpRequest, obj: TaskEnvironment, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        orders.tell_cluster_after_commit(obj.cluster_id)

    def delete_model(self, request: HttpRequest, obj: TaskEnvironment) -> None:
        cluster_id = obj.cluster_id
        super().delete_model(request, obj)
        orders.tell_cluster_after_commit(cluster_id)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[TaskEnvironment]) -> None:
        clusters = set(queryset.values_list("cluster_id", flat=True))
        super().delete_queryset(request, queryset)
        for cluster_id in clusters:
            orders.tell_cluster_after_commit(cluster_id)

    @admin.display(description="hosts that can run it")
    def hosts_ok(self, obj: TaskEnvironment) -> str:
        hosts = Host.objects.filter(cluster_id=obj.cluster_id).values_list("environments", "gpus")
        ok = sum(
            1
            for envs, gpus in hosts
            if not availability.why_not(availability.reports_of(envs).get(obj.name), obj.interpreter, bool(gpus))
        )
        return f"{ok} of {len(hosts)}"

    @admin.display(description="what each host found")
    def host_reports(self, obj: TaskEnvironment) -> str:
        if not obj.pk:
            return "—"
        rows = []
        for host in Host.objects.filter(cluster_id=obj.cluster_id).order_by("name"):
            report = availability.reports_of(host.environments).get(obj.name)
            why = availability.why_not(report, obj.interpreter, bool(host.gpus))
            found = _found(report) if isinstance(report, dict) else ""
            rows.append((host.name, why if why else "can run it", found))
        return format_html(
            "<table><tr><th>host</th><th>verdict</th><th>found</th></tr>{}</table>",
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", rows),
        )


def _found(report: dict[str, Any]) -> str:
    parts = [f"Python {report.get('python') or '?'}"]
    parts.append(f"TensorFlow {report['tensorflow']}" if report.get("tensorflow") else "no TensorFlow")
    if report.get("keras"):
        parts.append(f"Keras {report['keras']}")
    parts.append(f"{report.get('gpus_visible', 0)} GPU(s) visible to TensorFlow")
    return ", ".join(parts)


def host_environments(host: Host) -> str:
    """The host page's table: each environment of its cluster, what the agent found, and whether placement uses the
    host for it (the reason when NVML shows GPUs that the environment's TensorFlow cannot use)."""
    registered = dict(TaskEnvironment.objects.filter(cluster_id=host.cluster_id).values_list("name", "interpreter"))
    if not registered:
        return "no task environment registered on its cluster: tasks run in the agent's own interpreter"
    reports = availability.reports_of(host.environments)
    rows = []
    for name, interpreter in sorted(registered.items()):
        report = reports.get(name)
        why = availability.why_not(report, interpreter, bool(host.gpus))
        found = _found(report) if isinstance(report, dict) else "—"
        rows.append((name, interpreter, found, "yes" if not why else f"no: {why}"))
    return format_html(
        "<table><tr><th>environment</th><th>interpreter</th><th>found</th><th>used for its jobs</th></tr>{}</table>",
        format_html_join("", "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>", rows),
    )
