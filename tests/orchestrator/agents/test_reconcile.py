"""Every hello and heartbeat: the orchestrator converges what it believes runs on a host on what the agent reports.

The first tests are end to end (real orchestrator, real agents, a real orphaned process); the others apply reports
to rows directly.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone
from rest_framework.test import APIClient

from contracts.host_reports import HostFacts, HostReport, RecordedExit, RunningTask, TaskReport
from contracts.protocol import AGENT_HEARTBEAT, AGENT_HELLO
from contracts.signing import agent_mac_key
from orchestrator.agents import events, reconcile, reports
from orchestrator.metrics.log_store import store_lines
from orchestrator.models import Host, HostStatus, Job, JobState, Task, TaskLogLine, TaskState
from tests import factories
from tests.support.processes import gone, wait_until
from tests.support.wire import sealed
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
    # Its one line is out (stored): from now on it writes nothing, so it outlives its agent. Killed before that, the
    # print would meet a pipe nobody reads and end the script (a CI run under load: the "orphan" was already gone).
    wait_until(lambda: TaskLogLine.objects.filter(task=task, text__contains="training").exists(), 30,
               what="the task's first line")  # fmt: skip
    return host, token, agent, task


@contextlib.contextmanager
def standing_in_for(host: Host, token: str, redis_url: str) -> Iterator[None]:
    """Heartbeats for `host` from the test while its agent restarts, so a slow start on a loaded machine cannot make
    the watchdog declare the host lost first (a real restart beats the default 15 s timeout; the tests' is 4 s)."""
    app = Celery("stand-in", broker=redis_url, set_as_current=False)
    beat = Heartbeat(
        app, host=host.name, key=agent_mac_key(token, host.name), interval_s=0.5, facts=lambda: HostFacts(2, 1024)
    )
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
def test_a_restarted_agent_kills_the_orphan_of_its_previous_life_and_the_task_is_lost(
    long_job, start_agent, redis_url, orchestrator
):
    host, token, first, task = long_job

    with standing_in_for(host, token, redis_url):
        first.kill()  # SIGKILL: no shutdown, so its child (own session) stays behind, orphaned
        assert not gone(task.pid)
        second = start_agent(host.name, token)  # same host, same --workdir
        # The hello applied, as the orchestrator logs it. (Not the host's agent_pid: the stand-in's heartbeats, newer,
        # store their own facts, with no pid, over the hello's: under load the row never showed the new pid for 30 s.)
        orchestrator.wait_for_line(rf"agent on {host.name} started \(pid {second.pid},", timeout=30)

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


# --- reports applied to rows ---------------------------------------------------------------------------------------
SEQ = 1_000_000  # the agent's event clock when the workers' latest events were applied


@pytest.fixture
def placed(django_user_model):
    """A running two-worker job on one online host, as the scheduler and the agent's events left it."""
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
            event_seq=SEQ + i,
            ordered_at=started,
        )
        for i in range(2)
    ]
    return host, token, job, tasks


@pytest.fixture
def orders(monkeypatch):
    """The orders convergence sends, captured instead of queued: {"launch": [ids], "kill": [ids], "ack": [keys]}."""
    sent: dict[str, list] = {"launch": [], "kill": [], "ack": []}
    monkeypatch.setattr(reconcile.dispatch, "launch_tasks", sent["launch"].extend)
    monkeypatch.setattr(
        reconcile.dispatch, "kill_tasks", lambda tasks, reason, **_: sent["kill"].extend(t.pk for t in tasks)
    )
    monkeypatch.setattr(reconcile.dispatch, "acknowledge_exits", lambda host, keys: sent["ack"].extend(keys))
    return sent


def report_of(host: Host, token: str, tasks: TaskReport | None, *, hello: bool = False, raw_tasks: Any = None) -> dict:
    """A heartbeat (or hello) as `host`'s agent seals it; `raw_tasks`: a task section as it comes, malformed."""
    body = HostReport(facts=HostFacts(cpu_count=2, memory_total_mb=1024), tasks=tasks).to_body()
    if raw_tasks is not None:
        body["tasks"] = raw_tasks
    return sealed(host.name, token, AGENT_HELLO if hello else AGENT_HEARTBEAT, body)


def running(job: Job, *tasks: Task) -> list[RunningTask]:
    return [RunningTask(job_id=job.pk, task_id=t.pk, attempt=t.attempt, pid=t.pid or 1) for t in tasks]


def fresh(row):  # type: ignore[no-untyped-def]
    return type(row).objects.get(pk=row.pk)


@pytest.mark.django_db
def test_recorded_exits_end_their_tasks_once_and_are_acknowledged(placed, orders):
    host, token, job, (w0, w1) = placed
    exits = [RecordedExit(job_id=job.pk, task_id=w0.pk, attempt=1, seq=SEQ + 5, pid=1000, exit_code=0)]
    report = TaskReport(running=running(job, w1), exits=exits, events_upto=SEQ + 5)

    assert reports.handle_report(report_of(host, token, report), hello=False)
    assert reports.handle_report(report_of(host, token, report), hello=False)  # the next beat, before the ack landed

    w0 = fresh(w0)
    assert (w0.state, w0.exit_code, w0.event_seq) == (TaskState.SUCCEEDED, 0, SEQ + 5)
    # Worker 0 speaks for a MultiWorkerMirrored job: it has succeeded, and is final once worker 1 has ended too.
    assert (fresh(job).state, fresh(job).ending) == (JobState.RUNNING, JobState.SUCCEEDED)
    assert orders["ack"] == [(w0.pk, 1), (w0.pk, 1)]
    assert fresh(w1).state == TaskState.RUNNING

    ended = [RecordedExit(job_id=job.pk, task_id=w1.pk, attempt=1, seq=SEQ + 6, pid=1001, exit_code=0)]
    reports.handle_report(report_of(host, token, TaskReport(exits=ended, events_upto=SEQ + 6)), hello=False)
    assert fresh(job).state == JobState.SUCCEEDED
    assert fresh(job).reason == f"worker 0 on {host.name} exited 0"


@pytest.mark.django_db
def test_an_exit_waits_for_the_lines_its_task_printed(placed, orders):
    host, token, job, (w0, w1) = placed
    Task.objects.filter(pk=w1.pk).update(state=TaskState.SUCCEEDED)
    exits = [RecordedExit(job_id=job.pk, task_id=w0.pk, attempt=1, seq=SEQ + 5, pid=1000, exit_code=0, lines=3)]
    report = TaskReport(exits=exits, events_upto=SEQ + 5)
    reports.handle_report(report_of(host, token, report), hello=False)

    assert fresh(w0).state == TaskState.RUNNING  # two of its three lines are still on their way
    assert fresh(w0).exit_waiting["lines"] == 3
    assert orders["ack"] == []  # the agent keeps the exit, and says it again
    assert not fresh(job).is_terminal

    store_lines([TaskLogLine(task_id=w0.pk, seq=seq, stream="stdout", text=f"line {seq}") for seq in range(3)])
    events.apply_waiting_exits([w0.pk])
    assert (fresh(w0).state, fresh(w0).exit_waiting) == (TaskState.SUCCEEDED, None)
    assert fresh(job).state == JobState.SUCCEEDED


@pytest.mark.django_db
def test_a_failed_exit_heard_twice_restarts_the_job_once(placed, orders, django_capture_on_commit_callbacks):
    host, token, job, (w0, w1) = placed
    Job.objects.filter(pk=job.pk).update(max_restarts=3)
    exits = [RecordedExit(job_id=job.pk, task_id=w1.pk, attempt=1, seq=SEQ + 5, pid=1001, exit_code=-9)]
    report = TaskReport(running=running(job, w0), exits=exits, events_upto=SEQ + 5)

    with django_capture_on_commit_callbacks():
        for _ in range(3):
            reports.handle_report(report_of(host, token, report), hello=False)

    job = fresh(job)
    assert (job.state, job.restarts) == (JobState.RESTARTING, 1)
    assert (fresh(w1).state, fresh(w1).exit_code) == (TaskState.FAILED, -9)


@pytest.mark.django_db
def test_a_restarted_agents_lost_exits_send_the_job_through_its_policy(placed, orders):
    host, token, job, (w0, w1) = placed
    detail = "the agent restarted; its process (pid 1000) was still running and was killed"
    exits = [RecordedExit(job_id=job.pk, task_id=w0.pk, attempt=1, seq=SEQ + 9, pid=1000, detail=detail, lost=True)]

    reports.handle_report(report_of(host, token, TaskReport(exits=exits, events_upto=SEQ + 9), hello=True), hello=True)

    assert (fresh(w0).state, fresh(w0).detail) == (TaskState.LOST, detail)
    assert fresh(w1).state == TaskState.LOST
    assert fresh(w1).detail == "the agent on node-0 no longer runs it and recorded no exit"
    job = fresh(job)
    assert job.state == JobState.FAILED
    assert job.reason == "the agent on node-0 restarted; lost worker 0, worker 1"
    assert orders["ack"] == [(w0.pk, 1)]


@pytest.mark.django_db
def test_a_task_the_agent_no_longer_has_is_lost_only_by_a_report_written_after_its_last_event(placed, orders):
    host, token, job, (w0, w1) = placed
    Job.objects.filter(pk=job.pk).update(max_restarts=1)

    # Written before w1's newest event was emitted: it says nothing about w1.
    reports.handle_report(report_of(host, token, TaskReport(running=running(job, w0), events_upto=SEQ)), hello=False)
    assert fresh(w1).state == TaskState.RUNNING

    reports.handle_report(
        report_of(host, token, TaskReport(running=running(job, w0), events_upto=SEQ + 1)), hello=False
    )
    assert fresh(w1).state == TaskState.LOST
    job = fresh(job)
    assert (job.state, job.restarts) == (JobState.RESTARTING, 1)
    assert job.restart_reason == "the agent on node-0 no longer runs them; lost worker 1"


@pytest.mark.django_db
def test_unanswered_orders_are_sent_again_and_fresh_ones_are_left_alone(placed, orders):
    host, token, _job, (w0, w1) = placed
    long_ago = timezone.now() - timedelta(minutes=5)
    # w0: its launch went out just now (still queued for the agent); w1: its launch went out long ago and was lost.
    Task.objects.filter(pk=w0.pk).update(state=TaskState.PENDING, pid=None, event_seq=0, ordered_at=timezone.now())
    Task.objects.filter(pk=w1.pk).update(state=TaskState.PENDING, pid=None, event_seq=0, ordered_at=long_ago)

    reports.handle_report(report_of(host, token, TaskReport(events_upto=SEQ + 50)), hello=False)

    assert orders["launch"] == [w1.pk]
    assert {fresh(w0).state, fresh(w1).state} == {TaskState.PENDING}


@pytest.mark.django_db
def test_a_lost_kill_is_sent_again_while_the_agent_still_runs_the_task(placed, orders):
    host, token, job, (w0, w1) = placed
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED, reason="cancelled by alice")
    Task.objects.filter(pk=w0.pk).update(state=TaskState.STOPPING, ordered_at=timezone.now() - timedelta(minutes=1))
    Task.objects.filter(pk=w1.pk).update(state=TaskState.STOPPING, ordered_at=timezone.now())

    reports.handle_report(
        report_of(host, token, TaskReport(running=running(job, w0, w1), events_upto=SEQ + 9)), hello=False
    )

    assert orders["kill"] == [w0.pk]
    assert {fresh(w0).state, fresh(w1).state} == {TaskState.STOPPING}


@pytest.mark.django_db
def test_stopping_tasks_the_agent_no_longer_runs_are_killed_and_the_job_is_untouched(placed, orders):
    host, token, job, (w0, w1) = placed
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED, reason="cancelled by alice")
    Task.objects.filter(job=job).update(state=TaskState.STOPPING)

    reports.handle_report(report_of(host, token, TaskReport(events_upto=SEQ + 9)), hello=False)

    assert {fresh(w0).state, fresh(w1).state} == {TaskState.KILLED}
    assert (fresh(job).state, fresh(job).reason) == (JobState.CANCELLED, "cancelled by alice")
    assert fresh(w0).live_pid is None


@pytest.mark.django_db
def test_a_task_stopped_before_it_ever_started_gets_its_kill_so_the_agent_can_close_it(placed, orders):
    host, token, job, (w0, w1) = placed
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    Task.objects.filter(pk=w0.pk).update(
        state=TaskState.STOPPING, pid=None, event_seq=0, ordered_at=timezone.now() - timedelta(minutes=1)
    )

    reports.handle_report(
        report_of(host, token, TaskReport(running=running(job, w1), events_upto=SEQ + 9)), hello=False
    )

    assert orders["kill"] == [w0.pk]
    assert fresh(w0).state == TaskState.STOPPING  # until the agent's "killed before it started" exit arrives


@pytest.mark.django_db
def test_processes_that_are_not_active_tasks_here_are_killed(placed, orders):
    host, token, job, (w0, w1) = placed
    Task.objects.filter(pk=w1.pk).update(state=TaskState.LOST)
    stray = [RunningTask(job_id=999, task_id=99999, attempt=3, pid=4242)]  # no such task at all

    reports.handle_report(
        report_of(host, token, TaskReport(running=running(job, w0, w1) + stray, events_upto=SEQ + 9)), hello=False
    )

    assert sorted(orders["kill"]) == sorted([w1.pk, 99999])
    assert fresh(w0).state == TaskState.RUNNING


@pytest.mark.django_db
def test_reports_without_tasks_or_malformed_ones_converge_nothing(placed, orders):
    host, token, job, (w0, _w1) = placed

    reports.handle_report(report_of(host, token, None, hello=True), hello=True)
    bad = report_of(host, token, None, raw_tasks={"running": [{"task_id": "w0"}]})
    assert reports.handle_report(bad, hello=False)  # a malformed report is logged; the heartbeat still counts

    assert fresh(w0).state == TaskState.RUNNING
    assert fresh(job).state == JobState.RUNNING
    assert orders == {"launch": [], "kill": [], "ack": []}
