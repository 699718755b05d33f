from __future__ import annotations

from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import DefaultRouter

from orchestrator.api.agent_views import AgentJoinView
from orchestrator.api.experiment_views import ExperimentViewSet
from orchestrator.api.job_views import JobViewSet
from orchestrator.api.priority_views import PriorityClassesView
from orchestrator.api.token_views import ApiTokenViewSet, TokenView
from orchestrator.api.usage_views import UsageView
from orchestrator.api.views import ClusterViewSet, HostViewSet, api_not_found
from orchestrator.api.webhook_views import WebhookViewSet

router = DefaultRouter()
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("jobs", JobViewSet, basename="job")
router.register("experiments", ExperimentViewSet, basename="experiment")
router.register("webhooks", WebhookViewSet, basename="webhook")
router.register("tokens", ApiTokenViewSet, basename="api-tokens")

host_list = HostViewSet.as_view({"get": "list", "post": "create"})
host_detail = HostViewSet.as_view({"get": "retrieve", "put": "update", "patch": "partial_update", "delete": "destroy"})

urlpatterns = [
    path("token/", TokenView.as_view(), name="api-token"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("priority-classes/", PriorityClassesView.as_view(), name="priority-classes"),
    path("agents/join/", AgentJoinView.as_view(), name="agent-join"),
    path("usage/", UsageView.as_view(), name="usage"),
    path("clusters/<int:cluster_pk>/hosts/", host_list, name="cluster-hosts"),
    path("clusters/<int:cluster_pk>/hosts/<int:pk>/", host_detail, name="cluster-host-detail"),
    path("", include(router.urls)),
    # Last: a path no route matched (`/api/jobs/abc/`) answers JSON, as the rest of the API does.
    re_path(r"^(?P<path>[\s\S]*)$", api_not_found),
]
