"""A host speaks only for its own tasks (orchestrator/identity/foreign.py): reports correctly sealed by host B that name
a task placed on host A (running, exited, or in a task event) change nothing for that task: no state, no stamp, no
order to A, no resend held back. With the real handlers, PostgreSQL and Redis; only the launch resend at the end is
captured (the rows' job has no script to send)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.forms.models import model_to_dict
from django.utils import timezone

from contracts.host_reports import HostFacts, HostReport, RecordedExit, RunningTask, TaskReport
from contracts.metric_messages import TaskMetricsBatch
from contracts.protocol import AGENT_HEARTBEAT, AGENT_HELLO, TASK_EVENT, TASK_METRICS, agent_queue
from contracts.task_messages import TaskEvent, TaskEventKind
from orchestrator.agents import events, heartbeats, reconcile, reports
from orchestrator.identity import foreign
from orchestrator.metrics import lookups
from orchestrator.models import Host, HostStatus, Job, JobState, Task, TaskState
from orchestrator.plumbing import counters
from tests import factories
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db

SEQ = 1_000


@pytest.fixture
def two_hosts(alice, redis_url):  # type: ignore[no-untyped-def]
    """Host A (own-a) runs worker 0 of a job and waits for worker 1's launch, whose order went out long ago (a resend
    is due); host B (own-b) runs nothing. Returns (a, a's token, b, b's token, job, w0, w1)."""
    a, token_a = factories.host("own-a")
    b, token_b = factories.host("own-b", port_min=24200)
    Host.objects.filter(pk__in=[a.pk, b.pk]).update(status=HostStatus.ONLINE)
    job = Job.objects.create(
        owner=alice, cluster=a.cluster, name="j", strategy="multi_worker_mirrored", program_kind="script",
        workers=2, attempt=1, state=JobState.STARTING,
    )  # fmt: skip
    long_ago = timezone.now() - timedelta(minutes=5)
    w0 = Task.objects.create(
        job=job, attempt=1, type="worker", index=0, host=a, state=TaskState.RUNNING, pid=1000, event_seq=SEQ,
        started_at=long_ago, ordered_at=long_ago,
    )  # fmt: skip
    w1 = Task.objects.create(
        job=job, attempt=1, type="worker", index=1, host=a, state=TaskState.PENDING, ordered_at=long_ago
    )
    queues = redis.Redis.from_url(redis_url)
    queues.delete(agent_queue(a.name), agent_queue(b.name))
    yield a, token_a, b, token_b, job, w0, w1
    queues.delete(agent_queue(a.name), agent_queue(b.name))


def _report(host: Host, token: str, tasks: TaskReport, name: str = AGENT_HEARTBEAT) -> dict[str, Any]:
    body = HostReport(facts=HostFacts(cpu_count=2, memory_total_mb=1024), tasks=tasks).to_body()
    return sealed(host.name, token, name, body)


def _rows(*rows: Any) -> list[dict[str, Any]]:
    return [model_to_dict(type(row).objects.get(pk=row.pk)) for row in rows]


def test_another_hosts_reports_change_nothing_for_a_task_placed_on_a(two_hosts, redis_url, monkeypatch):
    a, token_a, b, token_b, job, w0, w1 = two_hosts
    lookups.lookups.forget()  # the ingest's caches: hosts of earlier tests with these names
    before = _rows(w0, w1, job)
    counted = counters.get(foreign.OTHER_HOSTS_TASKS)
    # B says it runs both of A's tasks and that worker 0 exited (failed), in every way a host reports.
    forged = TaskReport(
        running=[RunningTask(job_id=job.pk, task_id=t.pk, attempt=1, pid=4242) for t in (w0, w1)],
        exits=[RecordedExit(job_id=job.pk, task_id=w0.pk, attempt=1, seq=SEQ + 5, pid=1000, exit_code=1)],
        events_upto=SEQ + 5,
    )
    exited = TaskEvent(task_id=w0.pk, attempt=1, kind=TaskEventKind.EXITED, pid=1000, exit_code=1, seq=SEQ + 6)

    assert reports.handle_report(_report(b, token_b, forged, AGENT_HELLO), hello=True)
    assert reports.handle_report(_report(b, token_b, forged), hello=False)
    assert heartbeats.apply_batch([_report(b, token_b, forged)]) == 1
    assert not events.handle_task_event(sealed(b.name, token_b, TASK_EVENT, asdict(exited)))
    metrics = sealed(b.name, token_b, TASK_METRICS, asdict(TaskMetricsBatch(task_id=w0.pk, attempt=1, events=[])))
    assert lookups.task_of(metrics, TASK_METRICS, TaskMetricsBatch) is None

    assert _rows(w0, w1, job) == before  # no state, no exit, no stamp (ordered_at), no event number
    assert counters.get(foreign.OTHER_HOSTS_TASKS) - counted == 5
    queues = redis.Redis.from_url(redis_url)
    assert queues.llen(agent_queue(a.name)) == 0  # no order to A
    assert queues.llen(agent_queue(b.name)) > 0  # B was told to kill what it claims to run: its own business

    # A's own next report still gets worker 1's launch sent again: B's claims held nothing back.
    resent: list[int] = []
    monkeypatch.setattr(reconcile.dispatch, "launch_tasks", resent.extend)
    own = TaskReport(running=[RunningTask(job_id=job.pk, task_id=w0.pk, attempt=1, pid=1000)], events_upto=SEQ)
    assert reports.handle_report(_report(a, token_a, own), hello=False)
    assert resent == [w1.pk]
