from __future__ import annotations

from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Clusters and jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_save

        from orchestrator.metrics import live
        from orchestrator.models import Job, Task

        # Every saved change of a job or a task reaches the job's open pages (after commit); bulk updates of task
        # states (orchestrator/control/lifecycle.py) say so themselves.
        post_save.connect(lambda instance, **_: live.job_changed(instance.pk), sender=Job, weak=False)
        post_save.connect(lambda instance, **_: live.job_changed(instance.job_id), sender=Task, weak=False)
