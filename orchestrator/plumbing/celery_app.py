"""The control plane's Celery app object, which the domain sends with (`broker_sends`, `jobs/dispatch.py`) and defines
its entry points on (orchestrator/tasks.py): constructed and configured from Django's settings here, imports nothing
of the domain.

The wiring that needs the domain is config/celery.py's (`celery -A config.celery`): which modules hold the tasks, the
consumer steps (the scheduler lease's gate), the signals (the control key checked at start-up, the start-up heap frozen,
database connections kept). config/__init__.py imports it wherever Django is set up, so this app is wired by then.
"""

from __future__ import annotations

from celery import Celery

from contracts.protocol import ORCHESTRATOR_QUEUE

app = Celery("tfdash")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = ORCHESTRATOR_QUEUE
