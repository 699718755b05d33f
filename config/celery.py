"""The orchestrator's Celery app: placement, dispatch, heartbeats and the watchdog run on the `orchestrator` queue."""

from __future__ import annotations

import os

from celery import Celery

from contracts.protocol import ORCHESTRATOR_QUEUE

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("tfdash")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = ORCHESTRATOR_QUEUE
app.autodiscover_tasks(["orchestrator"])
