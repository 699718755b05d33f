from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.authtoken.views import obtain_auth_token
from rest_framework.routers import DefaultRouter

from orchestrator.api.job_views import JobViewSet
from orchestrator.api.views import ClusterViewSet, HostViewSet

router = DefaultRouter()
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("jobs", JobViewSet, basename="job")

host_list = HostViewSet.as_view({"get": "list", "post": "create"})
host_detail = HostViewSet.as_view({"get": "retrieve", "put": "update", "patch": "partial_update", "delete": "destroy"})

urlpatterns = [
    path("token/", obtain_auth_token, name="api-token"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("clusters/<int:cluster_pk>/hosts/", host_list, name="cluster-hosts"),
    path("clusters/<int:cluster_pk>/hosts/<int:pk>/", host_detail, name="cluster-host-detail"),
    path("", include(router.urls)),
]
