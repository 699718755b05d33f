"""Heartbeats read in batches from their stream (orchestrator/agents/heartbeats.py), with real Redis and PostgreSQL:
a fleet's steady beats cost a few statements per batch, not a few per host; replays are refused within a batch and
across batches; a host the watchdog declared lost comes back; each host is converged on its own report."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from contracts import broker
from contracts.host_reports import HostFacts, HostReport, RecordedExit, RunningTask, TaskReport
from contracts.protocol import AGENT_HEARTBEAT
from orchestrator.agents import heartbeats, reconcile
from orchestrator.identity import auth
from orchestrator.models import Host, HostStatus, Job, JobState, Task, TaskState
from orchestrator.plumbing import counters
from tests import factories
from tests.support.processes import wait_until
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db

FACTS = HostFacts(cpu_count=2, memory_total_mb=1024)


def beat(host: Host, token: str, tasks: TaskReport | None = None) -> dict:
    return sealed(host.name, token, AGENT_HEARTBEAT, HostReport(facts=FACTS, tasks=tasks).to_body())


def test_steady_heartbeats_of_a_fleet_cost_a_few_statements_per_batch(django_assert_max_num_queries):
    fleet = [factories.host(cluster_name="batch") for _ in range(40)]
    assert heartbeats.apply_batch([beat(h, t) for h, t in fleet]) == 40  # first reports: facts stored per host
    assert Host.objects.filter(cluster__name="batch", status=HostStatus.ONLINE).count() == 40
    Host.objects.filter(cluster__name="batch").update(last_heartbeat=timezone.now() - timedelta(seconds=5))
    before = timezone.now()

    # The hosts (1), one UPDATE of last_heartbeat for all (1), their tasks (1).
    with django_assert_max_num_queries(3):
        assert heartbeats.apply_batch([beat(h, t, TaskReport()) for h, t in fleet]) == 40

    assert Host.objects.filter(cluster__name="batch", last_heartbeat__gte=before).count() == 40


def test_a_replay_is_refused_in_the_same_batch_and_in_a_later_one():
    host, token = factories.host()
    one = beat(host, token)
    replayed = counters.get(auth.REPLAYED)

    assert heartbeats.apply_batch([one, one]) == 1
    assert heartbeats.apply_batch([one]) == 0
    assert counters.get(auth.REPLAYED) == replayed + 2


def test_a_forged_heartbeat_in_a_batch_is_refused_and_the_others_applied():
    good, token = factories.host()
    victim, _victim_token = factories.host()
    refused = counters.get(auth.REFUSED)

    assert heartbeats.apply_batch([beat(victim, "tfa_guessed"), beat(good, token)]) == 1
    assert counters.get(auth.REFUSED) == refused + 1
    assert Host.objects.get(pk=good.pk).status == HostStatus.ONLINE
    assert Host.objects.get(pk=victim.pk).status != HostStatus.ONLINE


def test_a_host_declared_offline_comes_back_online_from_a_batch():
    host, token = factories.host()
    heartbeats.apply_batch([beat(host, token)])
    Host.objects.filter(pk=host.pk).update(status=HostStatus.OFFLINE)  # the watchdog, meanwhile

    heartbeats.apply_batch([beat(host, token)])

    assert Host.objects.get(pk=host.pk).status == HostStatus.ONLINE


def test_each_host_of_a_batch_is_converged_on_its_own_report(alice, monkeypatch):
    monkeypatch.setattr(reconcile.dispatch, "acknowledge_exits", lambda host, keys: None)  # no agent to tell
    finishing, token_f = factories.host(cluster_name="conv")
    other, token_o = factories.host(cluster_name="conv")
    Host.objects.filter(cluster__name="conv").update(status=HostStatus.ONLINE)
    job = Job.objects.create(
        owner=alice, cluster=finishing.cluster, name="j", strategy="multi_worker_mirrored", program_kind="script",
        workers=2, attempt=1, state=JobState.RUNNING,
    )  # fmt: skip
    mine, theirs = (
        Task.objects.create(job=job, attempt=1, type="worker", index=i, host=host, state=TaskState.RUNNING,
                            pid=1000 + i, event_seq=10, started_at=timezone.now(), ordered_at=timezone.now())
        for i, host in enumerate((finishing, other))
    )  # fmt: skip
    exited = RecordedExit(job_id=job.pk, task_id=mine.pk, attempt=1, seq=11, pid=1000, exit_code=0)
    # `other` also says it runs `mine` (a confused report): not its task, so it changes nothing of it.
    confused = [RunningTask(job.pk, theirs.pk, 1, 1001), RunningTask(job.pk, mine.pk, 1, 1000)]
    batch = [
        beat(finishing, token_f, TaskReport(running=[], exits=[exited], events_upto=11)),
        beat(other, token_o, TaskReport(running=confused, events_upto=10)),
    ]
    killed: list[int] = []
    monkeypatch.setattr(reconcile.dispatch, "kill_tasks", lambda tasks, reason, **_: killed.extend(t.pk for t in tasks))

    assert heartbeats.apply_batch(batch) == 2

    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert (mine.state, mine.exit_code) == (TaskState.SUCCEEDED, 0)
    assert theirs.state == TaskState.RUNNING
    assert killed == [mine.pk]  # the process `other` runs under a task that is not its own is told to die


@pytest.mark.django_db(transaction=True)  # the reader's thread has a connection of its own
def test_a_reader_applies_what_agents_add_to_their_streams_and_drains_them(redis_url):
    host, token = factories.host()
    Host.objects.filter(pk=host.pk).update(status=HostStatus.OFFLINE)
    client = redis.Redis.from_url(redis_url)
    reader = heartbeats.reader(client, f"test-reader-{time.monotonic_ns()}", hosts=lambda: [host.name])
    stream = broker.stream(host.name, broker.HEARTBEATS)
    entry = client.xadd(stream, {"name": AGENT_HEARTBEAT, "envelope": json.dumps(beat(host, token))})
    stop = threading.Event()
    thread = threading.Thread(target=reader.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: Host.objects.get(pk=host.pk).status == HostStatus.ONLINE, timeout=15, what="host online")
        wait_until(lambda: not client.xrange(stream, entry, entry), timeout=15, what="the entry deleted")
    finally:
        stop.set()
        thread.join(10)


@pytest.mark.django_db(transaction=True)
def test_beats_added_after_redis_lost_the_stream_are_applied_when_the_group_is_made_again(redis_url):
    """Redis restarted without persistence: the stream and its group are gone, and the agents' next beats make a new
    stream before any reader has made the group again. Those beats are applied, not skipped (a CI run lost a job:
    both hosts were judged silent while their beats sat behind a group made at the stream's end)."""
    host, token = factories.host()
    Host.objects.filter(pk=host.pk).update(status=HostStatus.OFFLINE)
    client = redis.Redis.from_url(redis_url)
    stream = broker.stream(host.name, broker.HEARTBEATS)
    client.delete(stream)  # what the restart did
    entry = client.xadd(stream, {"name": AGENT_HEARTBEAT, "envelope": json.dumps(beat(host, token))})
    reader = heartbeats.reader(client, f"test-reader-{time.monotonic_ns()}", hosts=lambda: [host.name])

    assert reader.drain_once() == 0  # the group is made: from the stream's start
    assert reader.drain_once() == 1

    assert Host.objects.get(pk=host.pk).status == HostStatus.ONLINE
    assert not client.xrange(stream, entry, entry)


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_of_another_host_on_a_hosts_stream_is_refused(redis_url):
    """A host speaks only for itself, on its own streams: a (replayed) heartbeat of host A added to host B's stream
    brings A nowhere near online."""
    victim, victim_token = factories.host()
    liar, _liar_token = factories.host()
    Host.objects.filter(pk__in=[victim.pk, liar.pk]).update(status=HostStatus.OFFLINE)
    client = redis.Redis.from_url(redis_url)
    client.xadd(broker.stream(liar.name, broker.HEARTBEATS),
                {"name": AGENT_HEARTBEAT, "envelope": json.dumps(beat(victim, victim_token))})  # fmt: skip
    reader = heartbeats.reader(client, f"test-reader-{time.monotonic_ns()}", hosts=lambda: [liar.name])
    malformed = counters.get(auth.MALFORMED)

    reader.drain_once()
    assert reader.drain_once() == 1

    assert Host.objects.get(pk=victim.pk).status == HostStatus.OFFLINE
    assert counters.get(auth.MALFORMED) == malformed + 1
    assert reader.dead == 1
