"""The orchestrator's side of sealed agent messages (orchestrator/identity/auth.py), with real Redis and PostgreSQL: a
Celery message is applied once (its nonce remembered), never when stale or from the future, and every refusal is
logged and counted alike for an unknown host and a wrong key. The host key at rest opens only with the control key."""

from __future__ import annotations

import time
from dataclasses import asdict

import pytest
from django.db import OperationalError

from contracts.host_reports import HostFacts, HostReport
from contracts.protocol import AGENT_HEARTBEAT, TASK_EVENT
from contracts.task_messages import TaskEvent, TaskEventKind
from orchestrator.agents import events, reports
from orchestrator.identity import auth, keys, tokens
from orchestrator.models import Host, Job, Task
from orchestrator.plumbing import counters
from tests import factories
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db


def heartbeat(host: Host, token: str, *, now: float | None = None) -> dict:
    body = HostReport(facts=HostFacts(cpu_count=2, memory_total_mb=1024)).to_body()
    return sealed(host.name, token, AGENT_HEARTBEAT, body, now=now)


def test_a_heartbeat_is_applied_once_and_its_replay_refused_and_counted(caplog):
    host, token = factories.host()
    beat = heartbeat(host, token)
    replayed_before = counters.get(auth.REPLAYED)

    assert reports.handle_report(beat, hello=False)
    assert not reports.handle_report(beat, hello=False)

    assert counters.get(auth.REPLAYED) == replayed_before + 1
    assert "seen before" in caplog.text


def test_a_task_event_replayed_is_refused_before_it_reaches_the_task(alice):
    host, token = factories.host()
    job = Job.objects.create(owner=alice, cluster=host.cluster, name="j", strategy="multi_worker_mirrored",
                             program_kind="script", attempt=1, state="running")  # fmt: skip
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=host, state="starting")
    started = sealed(host.name, token, TASK_EVENT, asdict(TaskEvent(task.pk, 1, TaskEventKind.STARTED, pid=7, seq=5)))
    replayed_before = counters.get(auth.REPLAYED)

    assert events.handle_task_event(started)
    assert not events.handle_task_event(started)

    assert counters.get(auth.REPLAYED) == replayed_before + 1


def test_a_handler_that_met_an_outage_is_retried_not_refused(monkeypatch):
    """The nonce is remembered only once the handler succeeded: Celery's retry of the same message goes through."""
    host, token = factories.host()
    beat = heartbeat(host, token)
    original = reports.record

    def outage(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OperationalError("the database went away")

    monkeypatch.setattr(reports, "record", outage)
    with pytest.raises(OperationalError):
        reports.handle_report(beat, hello=False)
    monkeypatch.setattr(reports, "record", original)

    assert reports.handle_report(beat, hello=False)


@pytest.mark.parametrize("offset", [-400.0, 60.0], ids=["stale", "future"])
def test_a_message_outside_the_age_bounds_is_refused_and_counted(settings, offset):
    host, token = factories.host()
    stale_before = counters.get(auth.STALE)

    assert not reports.handle_report(heartbeat(host, token, now=time.time() + offset), hello=False)

    assert counters.get(auth.STALE) == stale_before + 1
    assert Host.objects.get(pk=host.pk).last_heartbeat is None


def test_an_unknown_host_and_a_wrong_key_get_the_same_answer(caplog):
    host, _token = factories.host("known-1")
    refused_before = counters.get(auth.REFUSED)

    assert not reports.handle_report(heartbeat(host, "tfa_wrong"), hello=False)
    assert not reports.handle_report(sealed("nobody-1", "tfa_whatever", AGENT_HEARTBEAT, {}), hello=False)

    assert counters.get(auth.REFUSED) == refused_before + 2
    lines = [r.getMessage() for r in caplog.records if r.name == "orchestrator.identity.auth"]
    assert [line.replace("known-1", "NAME").replace("nobody-1", "NAME") for line in lines] == [
        "agent message orchestrator.agent_heartbeat refused: bad credentials: host 'NAME'"
    ] * 2


def test_the_stored_host_key_opens_only_with_the_control_plane_key(settings):
    """A database dump holds the host's key encrypted: without the control key it forges nothing."""
    host, token = factories.host()
    assert tokens.check_token(host, token) and tokens.mac_key(host) is not None
    assert token not in host.agent_key

    settings.TFDASH_CONTROL_KEY_FILE = ""
    settings.TFDASH_CONTROL_KEY = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="  # another control plane's key
    keys.forget()
    try:
        assert tokens.mac_key(Host.objects.get(pk=host.pk)) is None
        assert not reports.handle_report(heartbeat(host, token), hello=False)  # not even the right token helps
    finally:
        keys.forget()  # the session's key again (settings are restored by the fixture)


def test_a_copied_key_does_not_open_on_another_host_row():
    first, _ = factories.host("row-1")
    second, _ = factories.host("row-2")

    assert keys.open_host_key(second.name, first.agent_key) is None
