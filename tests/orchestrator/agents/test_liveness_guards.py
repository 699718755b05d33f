"""The watchdog only declares a host lost when silence is the host's doing, not the orchestrator's own delay."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from contracts import broker
from orchestrator.agents import heartbeats, liveness, reports
from orchestrator.identity import tokens
from orchestrator.models import Cluster, Host, HostStatus
from orchestrator.plumbing import counters

pytestmark = pytest.mark.django_db


@pytest.fixture
def silent_host() -> Host:
    cluster = Cluster.objects.create(name=f"guards-{time.monotonic_ns()}")
    host = Host(
        cluster=cluster, name=f"quiet-{time.monotonic_ns()}", address="10.0.0.9", port_min=20000, port_max=20100
    )
    tokens.set_new_token(host)
    host.status = HostStatus.ONLINE
    host.last_heartbeat = timezone.now() - timedelta(seconds=settings.TFDASH_HEARTBEAT_TIMEOUT_S + 5)
    host.save()
    counters._client().delete("tfdash:readings:" + reports.REPORT_LAG)
    liveness._last_check = None
    liveness._first_check = time.monotonic() - settings.TFDASH_HEARTBEAT_TIMEOUT_S  # listening long enough
    return host


def test_a_silent_host_is_declared_offline_when_reports_arrive_promptly(silent_host: Host) -> None:
    counters.record_reading(reports.REPORT_LAG, "other-host", 0.05)

    assert silent_host.name in liveness.mark_silent_hosts_offline()
    silent_host.refresh_from_db()
    assert silent_host.status == HostStatus.OFFLINE


def test_no_host_is_judged_while_every_report_reaches_the_orchestrator_late(silent_host: Host) -> None:
    late = settings.TFDASH_HEARTBEAT_TIMEOUT_S * 0.75
    counters.record_reading(reports.REPORT_LAG, "other-host", late)
    counters.record_reading(reports.REPORT_LAG, "third-host", late + 1)

    assert liveness.mark_silent_hosts_offline() == []
    silent_host.refresh_from_db()
    assert silent_host.status == HostStatus.ONLINE

    # One prompt host shows the delay is not on this side: the silent one is judged again.
    counters.record_reading(reports.REPORT_LAG, "prompt-host", 0.05)
    assert silent_host.name in liveness.mark_silent_hosts_offline()


def test_a_watchdog_that_was_itself_stalled_listens_for_a_whole_timeout_again(silent_host: Host) -> None:
    """A stall of this side (or of Redis, which carries the ticks and the beats alike) kept hosts from being heard:
    their silence counts only once the watchdog has listened for a whole timeout since (a CI run lost a job to a
    judgement made 1.6 s after Redis came back, before the agents' first beats were read)."""
    liveness._last_check = time.monotonic() - settings.TFDASH_HEARTBEAT_TIMEOUT_S

    assert liveness.mark_silent_hosts_offline() == []
    assert liveness.mark_silent_hosts_offline() == []  # on time again, but not yet a whole timeout
    liveness._first_check = time.monotonic() - settings.TFDASH_HEARTBEAT_TIMEOUT_S
    assert silent_host.name in liveness.mark_silent_hosts_offline()


def test_a_watchdog_that_just_started_listens_for_a_whole_timeout_before_judging(silent_host: Host) -> None:
    liveness._first_check = None

    assert liveness.mark_silent_hosts_offline() == []  # e.g. the orchestrator was restarted: every heartbeat is old
    liveness._first_check = time.monotonic() - settings.TFDASH_HEARTBEAT_TIMEOUT_S
    assert silent_host.name in liveness.mark_silent_hosts_offline()


def test_no_host_is_judged_while_a_heartbeat_waits_unapplied(
    silent_host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heartbeat waiting in the stream (no reader reads it, or a reader is stuck holding it) may be the silent
    host's: nobody is judged until it has been applied."""
    counters.record_reading(reports.REPORT_LAG, "other-host", 0.05)
    # Its own heartbeat stream (no reader runs while tests without the session's orchestrator do).
    stream = broker.stream(silent_host.name, broker.HEARTBEATS)
    client = counters.client()
    waited_ms = int((time.time() - settings.TFDASH_HEARTBEAT_TIMEOUT_S) * 1000)
    entry = client.xadd(stream, {"name": "orchestrator.agent_heartbeat", "envelope": "{}"}, id=f"{waited_ms}-0")
    try:
        assert liveness.mark_silent_hosts_offline() == []  # unread, no group yet
        client.xgroup_create(stream, heartbeats.HEARTBEAT_GROUP, id="0")
        client.xreadgroup(heartbeats.HEARTBEAT_GROUP, "stuck-reader", {stream: ">"}, count=1)
        assert liveness.mark_silent_hosts_offline() == []  # read by a reader that has not applied it
        silent_host.refresh_from_db()
        assert silent_host.status == HostStatus.ONLINE

        client.xack(stream, heartbeats.HEARTBEAT_GROUP, entry)
        client.xdel(stream, entry)
        assert silent_host.name in liveness.mark_silent_hosts_offline()
    finally:
        client.delete(stream)
