"""A Celery worker of the control plane serves many messages on one database connection (config/celery.py
`keep_database_connections`), with the suite's real scheduler worker (conftest's `orchestrator`). Closing it after
every message, as the web server does, cost a new PostgreSQL backend and a SCRAM exchange per heartbeat, event and
scheduler pass."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psutil
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, connections

from orchestrator.models import Cluster, Job, JobState
from orchestrator.plumbing import pass_requests as passes
from tests.support.processes import ManagedProcess, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _backend_starts(pid: int) -> list[datetime]:
    """When each PostgreSQL backend serving process `pid` was started, found by the local ports of its TCP connections
    to the database."""
    db_port = int(settings.DATABASES["default"]["PORT"] or 5432)
    ports = [
        c.laddr.port
        for c in psutil.Process(pid).net_connections("tcp")
        if c.raddr and c.raddr.port == db_port and c.status == psutil.CONN_ESTABLISHED
    ]
    with connection.cursor() as cursor:
        cursor.execute("SELECT backend_start FROM pg_stat_activity WHERE client_port = ANY(%s)", [ports])
        return [start for (start,) in cursor.fetchall()]


class _Worker:
    """What worker_init's receivers are handed (a WorkController), as far as they read it."""

    def __init__(self, app: Any) -> None:
        self.app = app


def _db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def test_the_scheduler_keeps_its_connection_from_one_pass_to_the_next(orchestrator: ManagedProcess) -> None:
    # A cluster with no host: each pass over it fails its queued job at once ("can never run"), which says the pass
    # is over. The second pass is asked after the first is over: it is served by the connection the first opened.
    scheduler: ManagedProcess = orchestrator.scheduler  # type: ignore[attr-defined]
    owner = get_user_model().objects.create_user("conn-owner")
    cluster = Cluster.objects.create(name="connections")

    def one_pass() -> datetime:
        asked = _db_now()
        job = Job.objects.create(owner=owner, cluster=cluster, name="never", strategy="multi_worker_mirrored",
                                 program_kind="builtin", builtin="digits_mlp", workers=1)  # fmt: skip
        passes.schedule_soon(cluster.pk)
        wait_until(
            lambda: Job.objects.filter(pk=job.pk, state=JobState.FAILED).exists(), timeout=60, what="a pass over it"
        )
        return asked

    one_pass()
    second_asked = one_pass()
    starts = _backend_starts(scheduler.proc.pid)
    assert any(start < second_asked for start in starts), (second_asked, starts)


def test_a_worker_of_another_app_leaves_this_process_connections_as_they_are() -> None:
    # Celery's worker_init is sent for every app's workers: a test that runs a worker of its own app in-process
    # (tests/celery_steps/test_wakeup.py) once made the test process's connections persistent, and a thread's
    # connection kept the test database from being dropped at the session's end.
    from celery import Celery, signals

    from config.celery import app

    before = connections.settings["default"]["CONN_MAX_AGE"]
    try:
        signals.worker_init.send(sender=_Worker(Celery("another", set_as_current=False)))
        assert connections.settings["default"]["CONN_MAX_AGE"] == before
        signals.worker_init.send(sender=_Worker(app))
        assert connections.settings["default"]["CONN_MAX_AGE"] == settings.TFDASH_WORKER_CONN_MAX_AGE
    finally:
        connections.settings["default"]["CONN_MAX_AGE"] = before
