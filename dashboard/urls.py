from __future__ import annotations

from django.urls import path
from django.views.generic import RedirectView

from dashboard import (
    cluster_views,
    experiment_views,
    job_form_views,
    job_views,
    queue_views,
    token_views,
    usage_views,
    webhook_views,
)

app_name = "dashboard"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="dashboard:jobs", permanent=False), name="home"),
    path("clusters/", cluster_views.clusters, name="clusters"),
    path("clusters/hosts/", cluster_views.host_rows, name="host-rows"),
    path("clusters/<int:cluster_id>/queue/", queue_views.queue, name="queue"),
    path(
        "clusters/<int:cluster_id>/queue/<int:job_id>/<str:action>/",
        queue_views.queue_action,
        name="queue-action",
    ),
    path("jobs/", job_views.job_list, name="jobs"),
    path("jobs/compare/", job_views.job_compare, name="job-compare"),
    path("jobs/new/", job_form_views.job_new, name="job-new"),
    path("jobs/new/preview/", job_form_views.job_preview, name="job-preview"),
    path("jobs/new/calc/", job_form_views.job_calc, name="job-calc"),
    path("jobs/<int:job_id>/", job_views.job_detail, name="job"),
    path("jobs/<int:job_id>/live/", job_views.job_live, name="job-live"),
    path("jobs/<int:job_id>/cancel/", job_views.job_cancel, name="job-cancel"),
    path("experiments/", experiment_views.experiment_list, name="experiments"),
    path("experiments/<int:experiment_id>/", experiment_views.experiment_detail, name="experiment"),
    path("experiments/<int:experiment_id>/summary/", experiment_views.experiment_live, name="experiment-summary"),
    path("webhooks/", webhook_views.webhooks, name="webhooks"),
    path("webhooks/<int:webhook_id>/delete/", webhook_views.webhook_delete, name="webhook-delete"),
    path("tokens/", token_views.tokens, name="tokens"),
    path("usage/", usage_views.usage, name="usage"),
    path("tokens/<int:token_id>/revoke/", token_views.token_revoke, name="token-revoke"),
    path("experiments/<int:experiment_id>/cancel/", experiment_views.experiment_cancel, name="experiment-cancel"),
    path("experiments/<int:experiment_id>/target/", experiment_views.experiment_target, name="experiment-target"),
    path("jobs/<int:job_id>/tasks/<int:task_id>/log/", job_views.task_log, name="task-log"),
    path("jobs/<int:job_id>/log-tail/", job_views.job_log_tail, name="job-log-tail"),
]
