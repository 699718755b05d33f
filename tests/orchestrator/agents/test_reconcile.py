"""An agent says hello: the orchestrator reconciles what it believes runs on the host with what the agent reports.

The first test is end to end (real orchestrator, real agents, a real orphaned process); the others apply hellos to
rows directly.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from celery import Celery
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone
from rest_framework.test import APIClient

from contracts.protocol import AGENT_HEARTBEAT, AgentMessage, HostFacts, ReclaimedTask, RunningTask, TaskReport
from orchestrator.agents import reconcile, reports
from orchestrator.models import Host, HostStatus, Job, JobState, Task, TaskState
from tests import factories
from tests.support.processes import wait_until
from tests.worker_agent.recording import gone
from worker_agent.heartbeat import Heartbeat

SLEEPER = b"import time\nprint('training, as far as anyone can tell', flush=True)\ntime.sleep(600)\n"


# --- end to end ----------------------------------------------------------------------------------------------------
@pytest.fixture
def long_job(orchestrator, start_agent, django_user_model):
    """A host with a real agent running one long task (a plain sleeping script); returns (host, token, agent, task)."""
    host, token = factories.host("rec-0", port_min=27300)
    Host.objects.filter(pk=host.pk).update(port_max=27309, cpu_slots=2)
    agent = start_agent(host.name, token)
    wait_until(lambda: Host.objects.get(pk=host.pk).status == HostStatus.ONLINE, timeout=30, what="the host online")
    api = APIClient()
    api.force_authenticate(django_user_model.objects.create_user("alice", password="pw-alice-123"))
    response = api.post(
        "/api/jobs/",
        {
            "name": "long",
            "strategy": "mirrored",
            "workers": 1,
            "devices_per_worker": 1,
            "script": SimpleUploadedFile("sleeper.py", SLEEPER),
        },
        format="multipart",
    )
    assert response.status_code == 201, response.content
    task = wait_until(
        lambda: Task.objects.filter(job_id=response.json()["id"], state=TaskState.RUNNING).first(),
        30,
        what="a running task",
    )
    return host, token, agent, task


@contextlib.contextmanager
def standing_in_for(host: Host, token: str, redis_url: str) -> Iterator[None]:
    """Heartbeats for `host` from the test while its agent restarts, so a slow start on a loaded machine cannot make
    the watchdog declare the host lost first (a real restart beats the default 15 s timeout; the tests' is 4 s)."""
    app = Celery("stand-in", broker=redis_url, set_as_current=False)
    beat = Heartbeat(app, host=host.name, token=token, interval_s=0.5, facts=lambda: HostFacts(2, 1024))
    stopped = threading.Event()

    def run() -> None:
        while not stopped.is_set():
            beat.send(AGENT_HEARTBEAT)
            stopped.wait(0.5)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopped.set()
        thread.join()


@pytest.mark.django_db(transaction=True)
def test_a_restarted_agent_kills_the_orphan_of_its_previous_life_and_the_task_is_lost(long_job, start_agent, redis_url):
    host, token, first, task = long_job

    with standing_in_for(host, token, redis_url):
        first.kill()  # SIGKILL: no shutdown, so its child (own session) stays behind, orphaned
        assert not gone(task.pid)
        second = start_agent(host.name, token)  # same host, same --workdir
        wait_until(lambda: Host.objects.get(pk=host.pk).agent_pid == second.pid, 30, what="the new agent's hello")

    wait_until(lambda: gone(task.pid), timeout=20, what=f"the orphan {task.pid} to be killed")
    second.wait_for_line(rf"task {task.pk} attempt 1: killed orphaned processes \[{task.pid}\]", timeout=5)
    job = wait_until(lambda: (j := Job.objects.get(pk=task.job_id)).is_terminal and j, 20, what="the job to end")
    lost = Task.objects.get(pk=task.pk)
    assert lost.state == TaskState.LOST
    assert lost.detail == f"the agent restarted; its process (pid {task.pid}) was still running and was killed"
    # The state machine with the default policy (max_restarts 0): a lost task fails the job, as a lost host does.
    assert job.state == JobState.FAILED
    assert job.reason == "the agent on rec-0 restarted; lost worker 0"
    assert job.failed_task_id == task.pk


@pytest.mark.django_db(transaction=True)
def test_an_agent_back_after_its_host_was_declared_lost_still_kills_the_orphan(long_job, start_agent):
    host, token, first, task = long_job

    first.kill()
    job = wait_until(lambda: (j := Job.objects.get(pk=task.job_id)).is_terminal and j, 30, what="the host lost")
    assert job.reason == "host rec-0 went offline; lost worker 0"
    assert not gone(task.pid)  # the orphan outlived both its agent and its task
    start_agent(host.name, token)

    wait_until(lambda: gone(task.pid), timeout=20, what=f"the orphan {task.pid} to be killed")
    wait_until(lambda: Host.objects.get(pk=host.pk).status == HostStatus.ONLINE, timeout=30, what="the host back")
    lost = Task.objects.get(pk=task.pk)
    assert (lost.state, lost.detail) == (TaskState.LOST, "host rec-0 stopped answering")  # the first verdict stands
    assert Job.objects.get(pk=job.pk).reason == job.reason


# --- hellos applied to rows ----------------------------------------------------------------------------------------
@pytest.fixture
def placed(django_user_model):
    """A running two-worker job on one online host, as the scheduler and the agent's STARTED left it."""
    owner = django_user_model.objects.create_user("alice", password="pw-alice-123")
    host, token = factories.host("node-0")
    Host.objects.filter(pk=host.pk).update(status=HostStatus.ONLINE)  # no "came online" scheduling pass
    job = Job.objects.create(
        owner=owner, cluster=host.cluster, name="j", strategy="multi_worker_mirrored", program_kind="script",
        workers=2, attempt=1, state=JobState.RUNNING,
    )  # fmt: skip
    started = timezone.now() - timedelta(seconds=60)
    tasks = [
        Task.objects.create(
            job=job,
            attempt=1,
            type="worker",
            index=i,
            host=host,
            state=TaskState.RUNNING,
            pid=1000 + i,
            started_at=started,
        )
        for i in range(2)
    ]
    return host, token, job, tasks


def hello(host: Host, token: str, tasks: TaskReport | None, sent_at: float | None = None) -> dict:
    message = AgentMessage(
        host=host.name, token=token, facts=HostFacts(cpu_count=2, memory_total_mb=1024), tasks=tasks
    ).to_payload()
    if sent_at is not None:
        message["sent_at"] = sent_at
    return message


def fresh(row):  # type: ignore[no-untyped-def]
    return type(row).objects.get(pk=row.pk)


@pytest.mark.django_db
def test_tasks_the_restarted_agent_does_not_run_are_lost_and_the_job_fails(placed, django_capture_on_commit_callbacks):
    host, token, job, (w0, w1) = placed
    reclaimed = ReclaimedTask(job_id=job.pk, task_id=w0.pk, attempt=1, pid=1000, detail="the agent restarted; killed")

    with django_capture_on_commit_callbacks():
        assert reports.handle_report(hello(host, token, TaskReport(reclaimed=[reclaimed])), hello=True)

    assert (fresh(w0).state, fresh(w0).detail) == (TaskState.LOST, "the agent restarted; killed")
    assert fresh(w1).state == TaskState.LOST
    assert fresh(w1).detail == "the agent on node-0 restarted and no longer runs it"
    job = fresh(job)
    assert job.state == JobState.FAILED
    assert job.reason == "the agent on node-0 restarted; lost worker 0, worker 1"


@pytest.mark.django_db
def test_a_lost_task_goes_through_the_jobs_restart_policy(placed, django_capture_on_commit_callbacks):
    host, token, job, _tasks = placed
    Job.objects.filter(pk=job.pk).update(max_restarts=1)

    with django_capture_on_commit_callbacks():
        reports.handle_report(hello(host, token, TaskReport()), hello=True)

    job = fresh(job)
    assert job.state == JobState.RESTARTING
    assert job.restarts == 1
    assert job.restart_reason == "the agent on node-0 restarted; lost worker 0, worker 1"


@pytest.mark.django_db
def test_what_the_agent_runs_or_may_still_launch_is_left_alone(placed, django_capture_on_commit_callbacks):
    host, token, job, (w0, w1) = placed
    # w1's launch order is still queued for the new agent: never confirmed started, so not judged.
    Task.objects.filter(pk=w1.pk).update(state=TaskState.PENDING, pid=None, started_at=None)
    report = TaskReport(running=[RunningTask(job_id=job.pk, task_id=w0.pk, attempt=1)])

    with django_capture_on_commit_callbacks() as callbacks:
        reports.handle_report(hello(host, token, report), hello=True)

    assert fresh(w0).state == TaskState.RUNNING
    assert fresh(w1).state == TaskState.PENDING
    assert fresh(job).state == JobState.RUNNING
    assert callbacks == []


@pytest.mark.django_db
def test_a_task_started_after_the_hello_was_written_is_not_lost(placed):
    host, token, job, (w0, w1) = placed
    # Its launch overtook the hello: STARTED was stored after the agent wrote the (empty) report.
    Task.objects.filter(pk=w1.pk).update(started_at=timezone.now())
    report = TaskReport(running=[RunningTask(job_id=job.pk, task_id=w0.pk, attempt=1)])

    reports.handle_report(hello(host, token, report, sent_at=time.time() - 2), hello=True)

    assert fresh(w1).state == TaskState.RUNNING
    assert fresh(job).state == JobState.RUNNING


@pytest.mark.django_db
def test_a_task_that_was_being_stopped_is_killed_and_the_job_is_untouched(placed):
    host, token, job, (w0, w1) = placed
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED, reason="cancelled by alice")
    Task.objects.filter(job=job).update(state=TaskState.STOPPING)

    reports.handle_report(hello(host, token, TaskReport()), hello=True)

    assert {fresh(w0).state, fresh(w1).state} == {TaskState.KILLED}
    assert (fresh(job).state, fresh(job).reason) == (JobState.CANCELLED, "cancelled by alice")


@pytest.mark.django_db
def test_tasks_the_agent_runs_but_that_are_over_here_are_killed(
    placed, django_capture_on_commit_callbacks, monkeypatch
):
    host, token, job, (w0, w1) = placed
    Task.objects.filter(pk=w1.pk).update(state=TaskState.LOST)
    orders = []
    monkeypatch.setattr(reconcile.dispatch, "kill_tasks", lambda tasks, reason: orders.extend(tasks))
    report = TaskReport(
        running=[
            RunningTask(job_id=job.pk, task_id=w0.pk, attempt=1),
            RunningTask(job_id=job.pk, task_id=w1.pk, attempt=1),  # lost here (a partition, say)
            RunningTask(job_id=999, task_id=99999, attempt=3),  # no such task at all
        ]
    )

    with django_capture_on_commit_callbacks(execute=True):
        reports.handle_report(hello(host, token, report), hello=True)

    assert [(t.pk, t.job_id, t.attempt, t.host_id) for t in orders] == [
        (w1.pk, job.pk, 1, host.pk),
        (99999, 999, 3, host.pk),
    ]
    assert fresh(w0).state == TaskState.RUNNING


@pytest.mark.django_db
def test_heartbeats_and_hellos_without_a_report_reconcile_nothing(placed):
    host, token, job, (w0, _w1) = placed

    reports.handle_report(hello(host, token, TaskReport()), hello=False)  # a heartbeat never reconciles
    reports.handle_report(hello(host, token, None), hello=True)  # an agent from before reconciling
    bad = hello(host, token, None)
    bad["tasks"] = {"running": [{"task_id": "w0"}]}
    assert reports.handle_report(bad, hello=True)  # a malformed report is logged; the hello still counts

    assert fresh(w0).state == TaskState.RUNNING
    assert fresh(job).state == JobState.RUNNING
