"""An orchestrator worker started while PostgreSQL is away (a restart during an outage, a machine booting before its
database) still reads the hosts' streams, and does its start-up chores once the database answers.

Before, the broker users' sync at start raised on the database, which Celery logged, and the stream readers after it
never started: the worker stayed up applying no heartbeat and no task exit (the chaos soak's stuck tasks, seed 11)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import pytest

from scripts.celery_workers import worker_argv
from tests.support.processes import ManagedProcess
from tests.support.tcp_relay import TcpRelay


@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)  # service_env names the test database
def test_a_worker_started_during_a_database_outage_reads_the_streams_and_syncs_once_it_is_back(service_env):
    url = urlsplit(service_env["DATABASE_URL"])
    relay = TcpRelay((url.hostname or "127.0.0.1", url.port or 5432))  # closed: the database is away
    away = urlunsplit(url._replace(netloc=f"{url.netloc.rpartition('@')[0]}@127.0.0.1:{relay.port}"))
    worker = ManagedProcess(
        "orchestrator-outage",
        worker_argv("orchestrator", 2, "orchestrator-outage@%h"),
        {**service_env, "DATABASE_URL": away},
    )
    try:
        worker.wait_for_line(r"orchestrator-outage@\S+ ready", timeout=60)
        worker.wait_for_line(r"could not sync the hosts' broker users at start", timeout=30)
        # Every reader runs, the database away or not: each waits out the outage by itself.
        worker.wait_for_line(r"heartbeats reader orchestrator-outage@\S+ started", timeout=30)
        worker.wait_for_line(r"events reader orchestrator-outage@\S+ started", timeout=30)
        relay.open()
        worker.wait_for_line(r"did sync the hosts' broker users after an outage at start", timeout=60)
        assert "Signal handler" not in worker.output()  # no start-up handler raised into Celery
    finally:
        worker.stop()
        relay.close()
