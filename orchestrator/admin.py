"""Django admin: where an admin registers clusters and hosts, and sees each host's live status."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings
from django.contrib import admin, messages
from django.db import models
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from orchestrator.agents.join import control_plane_url
from orchestrator.environments import admin as environments_admin  # registers the environments' admin page
from orchestrator.identity import tokens
from orchestrator.metrics import stream as metrics_stream
from orchestrator.models import ApiToken, Cluster, Host, HostStatus, Job, PriorityClass, Quota, Task
from orchestrator.objectstore import store as storage
from orchestrator.plumbing import counters
from orchestrator.scheduler import class_rights


def _show_token_once(request: HttpRequest, host: Host, token: str) -> None:
    # The token goes into a file only the agent's user can read, never onto the command line (a flag shows in `ps`).
    messages.warning(
        request,
        format_html(
            "Agent token for <b>{}</b> (shown only now; store it safely): <code>{}</code><br>"
            "On that machine, as root, write it into <code>{}</code> (<code>umask 077</code>; mode 0600), then:{}"
            "The steps, and a systemd unit: docs/admin/add-a-machine.md.",
            host.name,
            token,
            tokens.TOKEN_PATH,
            _commands_html(tokens.agent_commands(host, control_plane_url(request))),
        ),
    )


def _commands_html(commands: dict[str, str]) -> str:
    return format_html(
        "<ol><li>install the agent (from a checkout of this version, or the wheel <code>make dist</code> writes): "
        "<code>{}</code></li><li>join: <code>{}</code></li><li>start it: <code>{}</code></li></ol>",
        commands["install"],
        commands["join"],
        commands["run"],
    )


# The address this request came to, for the commands a host's page shows (a display method sees no request).
_dashboard_url: ContextVar[str] = ContextVar("dashboard_url", default="")


@contextmanager
def _dashboard_url_of(request: HttpRequest) -> Iterator[None]:
    reset = _dashboard_url.set(control_plane_url(request))
    try:
        yield
    finally:
        _dashboard_url.reset(reset)


def _show_dead_letters(request: HttpRequest) -> None:
    """Stream entries the metric ingest could not store (orchestrator/metrics/stream.py), on the hosts page: they
    come from hosts, and a growing count means an agent or the ingest has a bug to look at."""
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        latest = metrics_stream.latest_dead_letters(client)
        total = counters.get(metrics_stream.DEAD_LETTERED)
    except redis.RedisError:
        return  # the page works without it
    if not latest:
        return
    rows = format_html_join(
        "",
        "<li>{} UTC: <code>{}</code> from host {}: {}</li>",
        (
            (
                datetime.fromtimestamp(float(letter.get("at") or 0), UTC).strftime("%Y-%m-%d %H:%M:%S"),
                letter.get("name", "")[:100],
                letter.get("host") or "?",
                letter.get("error", ""),
            )
            for letter in latest
        ),
    )
    messages.warning(
        request,
        format_html(
            "The metric ingest set aside {} stream entries it could not store (Redis stream <code>{}</code>); "
            "the latest:<ul>{}</ul>",
            total,
            metrics_stream.DEAD_LETTERS,
            rows,
        ),
    )


class HostInline(admin.TabularInline):
    model = Host
    fields = ("name", "address", "port_min", "port_max", "status", "last_heartbeat")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # added through the host form, which shows the new token


class QuotaInline(admin.TabularInline):
    """Devices a user or a group may use at once on the cluster before what they run counts as borrowed."""

    model = Quota
    extra = 0
    autocomplete_fields = ("user", "group")


@admin.register(PriorityClass)
class PriorityClassAdmin(admin.ModelAdmin):
    """Who may submit at each class: open to all, or the users and groups named (staff always; the default class is
    open to all whatever its box says). The queue page shows the same rule to everyone."""

    list_display = ("name", "value", "preemptible", "is_default", "who_may_use", "description")
    filter_horizontal = ("users", "groups")
    fields = (
        "name", "value", "preemptible", "min_run_s", "max_preemptions", "preemption_window_s", "is_default",
        "description", "open_to_all", "users", "groups",
    )  # fmt: skip

    def get_queryset(self, request: HttpRequest) -> QuerySet[PriorityClass]:
        return super().get_queryset(request).prefetch_related("users", "groups")

    @admin.display(description="who may use it")
    def who_may_use(self, obj: PriorityClass) -> str:
        return class_rights.who_may_use(obj)


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ("name", "host_count", "online_count", "price_per_device_hour", "created_at")
    search_fields = ("name",)
    inlines = [HostInline, QuotaInline]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}  # an endpoint typed without its scheme
    fieldsets = (
        (None, {"fields": ("name", "description", "shared_dir")}),
        ("Time limits", {"fields": ("default_time_limit_s", "max_time_limit_s", "stop_grace_s")}),
        ("Placement", {"fields": ("packing",)}),
        ("Fair share", {"fields": ("fair_share_half_life_s",)}),
        (
            "Usage",
            {
                "description": "Showback: the usage page and API show each account's device-hours on this cluster "
                "times this price as its cost. Nothing is billed.",
                "fields": ("price_per_device_hour",),
            },
        ),
        (
            "Object store",
            {
                "description": "Checkpoints and artifacts follow the job through an S3-compatible store: hosts get "
                "presigned URLs for their own job's keys, never the credentials, which stay in the file named here.",
                "fields": (
                    "store_endpoint",
                    "store_bucket",
                    "store_region",
                    "store_path_style",
                    "store_credentials_file",
                ),
            },
        ),
    )

    def save_model(self, request: HttpRequest, obj: Cluster, form: Any, change: bool) -> None:
        problem = storage.credentials_file_problem(obj.store_credentials_file)
        if problem:
            # Saved anyway (the file may be put in place after), but staff hear at once that it cannot serve yet.
            messages.warning(request, f"Object store credentials: {problem}")
        super().save_model(request, obj, form, change)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Cluster]:
        return (
            super()
            .get_queryset(request)
            .annotate(
                _hosts=Count("hosts", distinct=True),
            )
        )

    @admin.display(description="hosts", ordering="_hosts")
    def host_count(self, obj: Cluster) -> int:
        return obj._hosts  # type: ignore[attr-defined]

    @admin.display(description="online")
    def online_count(self, obj: Cluster) -> int:
        return obj.hosts.filter(status=HostStatus.ONLINE).count()


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "cluster",
        "address",
        "port_range",
        "status_badge",
        "heartbeat_age",
        "cpu_count",
        "memory",
        "devices",
        "agent",
    )
    list_filter = ("cluster", "status")
    search_fields = ("name", "address", "labels")
    actions = ["issue_new_token"]
    readonly_fields = (
        "status",
        "last_heartbeat",
        "cpu_count",
        "memory_total_mb",
        "gpus",
        "gpu_error",
        "task_environments",
        "tf_version",
        "agent_version",
        "agent_hostname",
        "agent_pid",
        "agent_started_at",
        "agent_protocol",
        "agent_refusal",
        "agent_commands",
        "created_at",
    )
    fieldsets = (
        (None, {"fields": ("cluster", "name", "address", ("port_min", "port_max"), "cpu_slots", "labels")}),
        (
            "Reported by the agent",
            {
                "fields": (
                    ("status", "last_heartbeat"),
                    ("cpu_count", "memory_total_mb"),
                    "gpus",
                    "gpu_error",
                    "task_environments",
                    ("tf_version", "agent_version"),
                    ("agent_hostname", "agent_pid", "agent_started_at"),
                    ("agent_protocol", "agent_refusal"),
                    "created_at",
                )
            },
        ),
        ("Put its agent in service", {"fields": ("agent_commands",)}),
    )

    class Media:
        css = {"all": ["orchestrator/admin.css"]}  # the status colours

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        with _dashboard_url_of(request):
            response = super().change_view(request, object_id, form_url, extra_context)
            if isinstance(response, TemplateResponse):
                response.render()  # here, while the address is known (rendered lazily otherwise)
            return response

    def get_fieldsets(self, request: HttpRequest, obj: Host | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        # A new host's commands come with its token, once it is saved.
        return fieldsets if obj is not None else [f for f in fieldsets if "agent_commands" not in f[1]["fields"]]

    @admin.display(description="commands")
    def agent_commands(self, obj: Host) -> str:
        if obj.pk is None or not _dashboard_url.get():
            return "—"
        return _commands_html(tokens.agent_commands(obj, _dashboard_url.get()))

    @admin.display(description="agent", ordering="agent_version")
    def agent(self, obj: Host) -> str:
        """Its version and protocol, and why its messages are refused when they are (an agent too old)."""
        said = format_html("{}<br><small>protocol {}</small>", obj.agent_version or "—", obj.agent_protocol or "—")
        if obj.agent_refusal:
            return format_html('{}<br><b class="host-status-offline">{}</b>', said, obj.agent_refusal)
        return said

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "GET":
            _show_dead_letters(request)
        return super().changelist_view(request, extra_context)

    def save_model(self, request: HttpRequest, obj: Host, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if not change:
            _show_token_once(request, obj, tokens.issue(obj))

    @admin.action(description="Issue a new agent token (the old one stops working)")
    def issue_new_token(self, request: HttpRequest, queryset: QuerySet[Host]) -> None:
        for host in queryset:
            _show_token_once(request, host, tokens.issue(host))

    @admin.display(description="task environments")
    def task_environments(self, obj: Host) -> str:
        return environments_admin.host_environments(obj)

    @admin.display(description="ports")
    def port_range(self, obj: Host) -> str:
        return f"{obj.port_min}–{obj.port_max}"

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Host) -> str:
        # Coloured by orchestrator/static/orchestrator/admin.css: the Content-Security-Policy allows no inline style.
        return format_html('<b class="host-status host-status-{}">{}</b>', obj.status, obj.get_status_display())

    @admin.display(description="last heartbeat", ordering="last_heartbeat")
    def heartbeat_age(self, obj: Host) -> str:
        if obj.last_heartbeat is None:
            return "never"
        return f"{(timezone.now() - obj.last_heartbeat).total_seconds():.0f} s ago"

    @admin.display(description="memory")
    def memory(self, obj: Host) -> str:
        return f"{obj.memory_total_mb / 1024:.1f} GiB" if obj.memory_total_mb else "—"

    @admin.display(description="devices")
    def devices(self, obj: Host) -> str:
        if obj.gpus:
            return ", ".join(f"{g['index']}: {g['name']} ({g['memory_total_mb'] // 1024} GiB)" for g in obj.gpus)
        return f"no GPU; {obj.device_slots} CPU slots"


class TaskInline(admin.TabularInline):
    model = Task
    extra = 0
    readonly_fields = ("type", "index", "host", "port", "state", "exit_code")
    can_delete = False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "cluster", "strategy", "state", "created_at")
    list_filter = ("state", "strategy", "cluster")
    search_fields = ("name", "owner__username")
    inlines = [TaskInline]

    # A job's class changes on the queue page (or POST /api/jobs/<id>/priority/) alone, where it is recorded in the
    # job's history: an edit here would move a job past its owner's right without a trace.
    readonly_fields = ("priority_class",)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Users' API tokens, for staff to revoke one (a leaked token: delete it, it stops at once). Only a token's hash
    is stored, so none can be shown; none is made here (a user makes their own)."""

    list_display = ("user", "name", "hint", "created_at", "last_used_at", "expires_at")
    search_fields = ("user__username", "name")
    list_select_related = ("user",)
    exclude = ("digest",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
