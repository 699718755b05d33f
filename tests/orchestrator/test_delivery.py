"""Agent events reach the job however the orchestrator fares: a real orchestrator (Celery worker) on a private Redis
and the isolated test database, events published as an agent publishes them (entries of its host's events stream, read
and applied by the worker's intake: orchestrator/agents/intake.py).

- SIGKILLed while it holds events it has read but not applied: they are not lost, and a restarted orchestrator reads
  them again at once, as the same consumer (not after another reader's claim, 30 s);
- an event whose handling meets a database error (a lock it cannot get in time) stays pending, is handed over again
  with backoff and applied once;
- the same event delivered again changes nothing;
- an agent SIGKILLed after its task exited, whose EXITED event was lost on the broker, reports the recorded exit
  from its workdir when it comes back, and the task ends with its real exit code.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
import redis
from celery import Celery
from django.db import connections, transaction

from contracts import broker
from contracts.broker import without_credentials
from contracts.protocol import AGENT_LAUNCH, EVENTS_GROUP, TASK_EVENT, agent_queue, stream_entry
from contracts.task_messages import TaskEvent, TaskEventKind
from orchestrator.agents import intake
from orchestrator.identity import tokens
from orchestrator.jobs import dispatch
from orchestrator.models import Cluster, Host, HostStatus, Job, JobState, Script, Task, TaskState
from orchestrator.plumbing import streams
from tests.orchestrator.test_redis_restart import (  # noqa: F401 - the fixtures are used by name
    DB,
    Deployment,
    deployment,
    private_redis,
)
from tests.support.processes import ManagedProcess, wait_until
from tests.support.wire import broker_user, control_key_flags, sealed, signed_order

pytestmark = pytest.mark.django_db(transaction=True, databases=[DB])


@pytest.fixture
def running_job() -> Iterator[tuple[Job, Task, str]]:
    """A one-worker MultiWorkerMirrored job whose only task runs on a registered host: (job, task, host token)."""
    cluster = Cluster.objects.using(DB).create(name="delivery-lab")
    host = Host(cluster=cluster, name="delivery-0", address="127.0.0.1", port_min=30700, port_max=30709)
    token = tokens.issue(host, using=DB)
    from django.contrib.auth import get_user_model

    owner = get_user_model().objects.db_manager(DB).create_user("carol", password="pw-carol-123")
    job = Job.objects.using(DB).create(
        owner=owner, cluster=cluster, name="delivery", strategy="multi_worker_mirrored", program_kind="builtin",
        builtin="digits_mlp", state=JobState.RUNNING, attempt=1,
    )  # fmt: skip
    task = Task.objects.using(DB).create(
        job=job, attempt=1, type="worker", index=0, host=host, port=30700, state=TaskState.RUNNING, pid=4242
    )
    yield job, task, token


def _publish_exit(redis_url: str, host: str, token: str, task: Task, code: int, seq: int = 0) -> None:
    """What an agent's outbox sends when the task's process exits: an entry of its host's events stream."""
    event = TaskEvent(
        task_id=task.pk, attempt=task.attempt, kind=TaskEventKind.EXITED, pid=4242, exit_code=code, seq=seq
    )
    envelope = sealed(host, token, TASK_EVENT, asdict(event))
    client = redis.Redis.from_url(redis_url)
    client.xadd(broker.stream(host, broker.EVENTS), stream_entry(TASK_EVENT, envelope))
    client.close()


def _pending(redis_url: str, host: str) -> int:
    """The host's events read by a reader and not acknowledged."""
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.xpending(broker.stream(host, broker.EVENTS), EVENTS_GROUP)["pending"])
    except redis.ResponseError:  # no group yet: nothing read
        return 0
    finally:
        client.close()


def _holding_the_job_row(job: Job) -> transaction.Atomic:
    """A transaction of the test's own that holds the job's row lock: every lifecycle handler of the job waits."""
    atomic = transaction.atomic(using=DB)
    atomic.__enter__()
    Job.objects.using(DB).select_for_update().get(pk=job.pk)
    return atomic


def _release(atomic: transaction.Atomic) -> None:
    atomic.__exit__(None, None, None)
    connections[DB].close()


def _start_orchestrator(stack: Deployment, **env: str) -> None:
    stack.env.update(env)
    stack._start_orchestrator()
    stack.procs["orchestrator"].wait_for_line(r"orchestrator-restart@\S+ ready", timeout=60)


def test_events_taken_by_a_killed_orchestrator_are_applied_at_once_by_the_next(
    deployment: Deployment,  # noqa: F811
    running_job: tuple[Job, Task, str],
) -> None:
    job, task, token = running_job
    _start_orchestrator(deployment, TFDASH_DB_LOCK_TIMEOUT_MS="120000")
    lock = _holding_the_job_row(job)
    try:
        _publish_exit(deployment.redis_url, "delivery-0", token, task, code=0)
        # Read (unacknowledged) and stuck on the lock: that is the moment a crash costs an event that was acknowledged
        # before it was applied.
        wait_until(lambda: _pending(deployment.redis_url, "delivery-0") == 1, 30,
                   what="the event read by the orchestrator")  # fmt: skip
        deployment.kill("orchestrator")
    finally:
        _release(lock)
    assert Task.objects.using(DB).get(pk=task.pk).state == TaskState.RUNNING  # nothing was applied yet

    restarted = time.monotonic()
    _start_orchestrator(deployment)
    wait_until(lambda: Job.objects.using(DB).get(pk=job.pk).is_terminal, 60, what="the exit applied after restart")
    took_s = time.monotonic() - restarted
    job.refresh_from_db(using=DB)
    task.refresh_from_db(using=DB)
    assert (job.state, task.state, task.exit_code) == (JobState.SUCCEEDED, TaskState.SUCCEEDED, 0), job.reason
    # Read again by the restarted worker (the same consumer, its own pending entries first), not claimed by another
    # reader once idle for intake.CLAIM_IDLE_MS; and acknowledged once applied.
    assert took_s < intake.CLAIM_IDLE_MS / 1000, took_s
    wait_until(lambda: _pending(deployment.redis_url, "delivery-0") == 0, 30, what="the event acknowledged")
    print(f"delivery: the exit read by the killed orchestrator was applied {took_s:.1f} s after the restart")


def test_an_event_whose_handler_meets_a_database_error_is_retried_and_applied_once(
    deployment: Deployment,  # noqa: F811
    running_job: tuple[Job, Task, str],
) -> None:
    job, task, token = running_job
    # The handling gives up waiting for the lock after 0.5 s (an OperationalError): the reader keeps the entry and
    # hands it over again with backoff.
    _start_orchestrator(deployment, TFDASH_DB_LOCK_TIMEOUT_MS="500")
    lock = _holding_the_job_row(job)
    try:
        _publish_exit(deployment.redis_url, "delivery-0", token, task, code=3)
        wait_until(lambda: deployment.output("orchestrator").count("events reader: database unavailable") >= 3, 30,
                   what="the handling to fail on the lock, again and again")  # fmt: skip
        assert _pending(deployment.redis_url, "delivery-0") == 1  # not acknowledged, nor dead-lettered
        assert Task.objects.using(DB).get(pk=task.pk).state == TaskState.RUNNING
    finally:
        _release(lock)
    wait_until(lambda: Job.objects.using(DB).get(pk=job.pk).is_terminal, 60, what="the exit applied after the retry")
    job.refresh_from_db(using=DB)
    task.refresh_from_db(using=DB)
    assert (job.state, task.state, task.exit_code) == (JobState.FAILED, TaskState.FAILED, 3)
    assert job.reason == f"{task.label} exited with code 3"
    assert "lock timeout" in deployment.output("orchestrator")
    wait_until(lambda: _pending(deployment.redis_url, "delivery-0") == 0, 30, what="the event acknowledged")
    client = redis.Redis.from_url(deployment.redis_url)
    assert not client.xrange(streams.dead_letter_stream(broker.EVENTS))  # an outage dead-letters nothing
    assert "replayed exited" not in deployment.output("orchestrator")  # applied once


def test_the_same_event_delivered_twice_changes_nothing(
    deployment: Deployment,  # noqa: F811
    running_job: tuple[Job, Task, str],
) -> None:
    job, task, token = running_job
    Job.objects.using(DB).filter(pk=job.pk).update(max_restarts=5)  # a killed worker is retryable: one restart
    _start_orchestrator(deployment)

    for _ in range(3):  # read again after a crash, or the agent's outbox sent it twice across a reconnect
        _publish_exit(deployment.redis_url, "delivery-0", token, task, code=-9, seq=77)
    wait_until(lambda: deployment.output("orchestrator").count(f"replayed exited of task {task.pk} ignored") == 2,
               60, what="both repeats handled")  # fmt: skip

    job.refresh_from_db(using=DB)
    task.refresh_from_db(using=DB)
    assert (task.state, task.exit_code, task.event_seq) == (TaskState.FAILED, -9, 77)
    # Restarted once, whatever became of the new attempt (no agent runs here: it may wait, or fail to be placed).
    assert job.restarts == 1
    assert job.restart_reason == f"{task.label} was killed by signal 9"


def test_an_agent_restarted_after_its_exit_event_was_lost_reports_the_exit_and_the_task_ends_right(
    deployment: Deployment,  # noqa: F811
    running_job: tuple[Job, Task, str],
    tmp_path: Path,
) -> None:
    job, task, token = running_job
    host = task.host
    # The orchestrator is down for now: nothing reads what the agent reports.
    Host.objects.using(DB).filter(pk=host.pk).update(status=HostStatus.OFFLINE, cpu_slots=2)
    script = Script.objects.using(DB).create(
        sha256=hashlib.sha256(EXIT_3).hexdigest(), content=EXIT_3, size=len(EXIT_3), filename="exit3.py"
    )
    Job.objects.using(DB).filter(pk=job.pk).update(strategy="mirrored", program_kind="script", script=script)
    Task.objects.using(DB).filter(pk=task.pk).update(
        state=TaskState.PENDING, pid=None, port=None, devices=[0], event_seq=0
    )
    task.refresh_from_db(using=DB)
    agent = _start_agent(deployment, "delivery-0", token, tmp_path / "agent")
    _send_launch(deployment.redis_url, task, token)
    ledger_entry = tmp_path / "agent" / "ledger" / f"{task.pk}-{task.attempt}.json"
    wait_until(lambda: ledger_entry.exists() and '"exited"' in ledger_entry.read_text(), 30, what="the exit recorded")

    agent.kill()  # SIGKILL, and its STARTED and EXITED events are lost on the broker
    client = redis.Redis.from_url(deployment.redis_url)
    events = broker.stream("delivery-0", broker.EVENTS)
    wait_until(lambda: client.xlen(events) > 0, 10, what="the agent's events sent")
    client.delete(events)

    _start_agent(deployment, "delivery-0", token, tmp_path / "agent")  # its next life, same workdir
    # No ingest runs here, so the task's printed line never comes in: its exit is applied once the orchestrator has
    # waited for its lines (TFDASH_EXIT_LINES_WAIT_S, 30 s by default), not sooner; 2 s here.
    _start_orchestrator(deployment, TFDASH_EXIT_LINES_WAIT_S="2")

    task = wait_until(lambda: (t := Task.objects.using(DB).get(pk=task.pk)).state == TaskState.FAILED and t, 180,
                      what="the recorded exit applied")  # fmt: skip
    assert task.exit_code == 3 and task.live_pid is None
    job.refresh_from_db(using=DB)
    assert (job.state, job.reason) == (JobState.FAILED, f"{task.label} exited with code 3")
    # Acknowledged: the agent forgets it, and its reports stop carrying it.
    wait_until(lambda: '"acked"' in ledger_entry.read_text(), 30, what="the exit acknowledged")


EXIT_3 = b"import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n"


def _start_agent(stack: Deployment, host: str, token: str, workdir: Path) -> ManagedProcess:
    broker_user(stack.redis_url, host, token)  # the orchestrator that would make it may be down
    env = {**os.environ, "TFDASH_AGENT_TOKEN": token, "PYTHONUNBUFFERED": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = ManagedProcess(
        f"agent-{host}",
        [sys.executable, "-m", "worker_agent", "--server", without_credentials(stack.redis_url), "--host", host,
         *control_key_flags(), "--heartbeat-interval", "0.5", "--workdir", str(workdir)],
        env,
    )  # fmt: skip
    stack.procs[f"agent-{host}-{len(stack.procs)}"] = proc  # stopped (and its log kept) with the deployment
    return proc


def _send_launch(redis_url: str, task: Task, token: str) -> None:
    """The launch order as the orchestrator signs and queues it."""
    task = Task.objects.using(DB).select_related("host", "job", "job__script", "job__cluster").get(pk=task.pk)
    spec = dispatch.launch_spec(task, {})
    app = Celery("delivery-test", broker=redis_url, set_as_current=False)
    order = signed_order(task.host.name, AGENT_LAUNCH, asdict(spec))
    app.send_task(AGENT_LAUNCH, args=[order], queue=agent_queue(task.host.name))
    app.close()
