from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Dashboard"

    def ready(self) -> None:
        # Here, not at the top: the user model is known only once the apps are loaded.
        from dashboard import access  # noqa: PLC0415

        access.connect_user_signals()
