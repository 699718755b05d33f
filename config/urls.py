from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from orchestrator.monitoring.views import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("orchestrator.api.urls")),
    path("metrics", metrics, name="metrics"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("dashboard.urls")),
]
