"""The orchestrator's Celery app, wired (`celery -A config.celery`): placement, dispatch, heartbeats and the watchdog
run on the `orchestrator` queue. The app object itself is orchestrator/plumbing/celery_app.py's, which the domain
imports; this module, on top, adds what needs the domain: the tasks' modules, the consumer steps and the signals."""

from __future__ import annotations

import os
from typing import Any

from celery import signals

from celery_steps.wakeup import keep_consumer_awake
from orchestrator.leases.queue_gate import SchedulerLeaseGate
from orchestrator.plumbing.celery_app import app
from orchestrator.plumbing.gc_pause import freeze_startup_heap

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

__all__ = ["app", "freeze_startup_heap"]

app.autodiscover_tasks(["orchestrator"])
# The worker runs a thread pool (--pool threads): without this its consumer takes new messages only every 10 s once its
# prefetch count is reached (celery_steps/wakeup.py).
keep_consumer_awake(app)
# One scheduler acts however many run: a worker of the scheduler queue consumes it only while it holds the lease.
app.steps["consumer"].add(SchedulerLeaseGate)


def _require_control_key(sender: Any = None, **kwargs: Any) -> None:
    """A worker or beat of this app without a usable control key (it signs every order) stops as it starts. Celery
    re-raises what a receiver of `import_modules` raises (other signals only log it); Django is set up by then
    (Celery's Django fixup receives the signal first)."""
    from orchestrator.checks import require_control_key  # noqa: PLC0415 - the app module loads before Django

    require_control_key()


signals.import_modules.connect(_require_control_key, sender=app, weak=False)


signals.worker_ready.connect(freeze_startup_heap, weak=False)


def keep_database_connections(sender: Any = None, **kwargs: Any) -> None:
    """A worker's threads keep their database connections between messages for TFDASH_WORKER_CONN_MAX_AGE seconds
    (Celery's Django fixup closes one at a message's end only once it is older: config/settings.py says why). A
    connection that met an error is closed all the same (orchestrator/tasks.py: a retried handler starts afresh).
    Only a worker of this app: the signal is every app's, and a test that runs a worker of its own in-process must
    not turn the test process's connections persistent."""
    if getattr(sender, "app", None) is not app:
        return
    from django.conf import settings  # noqa: PLC0415 - the app module loads before Django
    from django.db import connections  # noqa: PLC0415

    for alias in connections:
        # The settings every connection of this alias is made from, now and in threads not started yet.
        connections.settings[alias]["CONN_MAX_AGE"] = settings.TFDASH_WORKER_CONN_MAX_AGE
        # Kept per thread, not pooled: Django refuses both (TFDASH_DB_POOL is the web server's).
        connections.settings[alias].get("OPTIONS", {}).pop("pool", None)


signals.worker_init.connect(keep_database_connections, weak=False)
