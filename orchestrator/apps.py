from __future__ import annotations

from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Clusters and jobs"
    default_auto_field = "django.db.models.BigAutoField"
