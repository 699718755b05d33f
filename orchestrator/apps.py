from __future__ import annotations

from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Clusters and jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Here, not at the top: Django imports apps before their models are ready.
        from django.db import transaction  # noqa: PLC0415
        from django.db.models.signals import post_delete, post_save  # noqa: PLC0415

        from orchestrator import checks  # noqa: F401, PLC0415 - registers the start-up checks
        from orchestrator.agents import events  # noqa: PLC0415
        from orchestrator.identity import broker_users  # noqa: PLC0415
        from orchestrator.metrics import ingest, live  # noqa: PLC0415
        from orchestrator.models import Host, Job, Task  # noqa: PLC0415

        # Every saved change of a job or a task reaches the job's open pages (after commit); bulk updates of task
        # states (orchestrator/jobs/lifecycle.py) say so themselves.
        post_save.connect(lambda instance, using, **_: live.job_changed(instance.pk, using), sender=Job, weak=False)
        post_save.connect(
            lambda instance, using, **_: live.job_changed(instance.job_id, using), sender=Task, weak=False
        )
        # An exit waiting for its task's last lines is applied as soon as they are stored.
        if events.apply_waiting_exits not in ingest.LINES_IN:
            ingest.LINES_IN.append(events.apply_waiting_exits)
        # A deleted host's broker user goes at once (after commit), with its open connections.
        post_delete.connect(
            lambda instance, using, **_: transaction.on_commit(
                lambda: broker_users.remove_quietly(instance.name), using=using
            ),
            sender=Host,
            weak=False,
        )
