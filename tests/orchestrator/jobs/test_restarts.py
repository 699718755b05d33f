"""The restart policy and hang detection, driven through the lifecycle with real PostgreSQL (no TF: the events an
agent would send are applied directly; the real-process versions are in test_faults_e2e.py)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from contracts.strategies import speaks_for_job
from contracts.task_messages import TaskEvent, TaskEventKind
from orchestrator.core import restarts
from orchestrator.core.preemption import Protection
from orchestrator.jobs import hangs, lifecycle, reaping, task_events
from orchestrator.jobs.restarts import host_lost
from orchestrator.models import Job, JobState, Task, TaskLogLine, TaskState
from orchestrator.scheduler import scheduling
from tests import factories

NO_BOUND = Protection(min_run_s=0, max_preemptions=None, window_s=0)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("policy", "code", "lost", "expected"),
    [
        ("exit_code", 1, False, False),
        ("exit_code", 127, False, False),
        ("exit_code", 137, False, True),
        ("exit_code", -9, False, True),
        ("exit_code", None, True, True),
        ("on_failure", 1, False, True),
        ("never", -9, False, False),
        ("never", None, True, False),
    ],
)
def test_which_failures_are_retryable(policy, code, lost, expected):
    assert restarts.retryable(policy, code, lost=lost) is expected


def running_job(owner, *, strategy="multi_worker_mirrored", workers=2, ps=0, max_restarts=1, **fields) -> Job:
    """A job placed and running on two hosts, as the scheduler leaves it."""
    host_a, _ = factories.host(port_min=25000)
    host_b, _ = factories.host(port_min=25100)
    for host in (host_a, host_b):
        host.cpu_slots, host.status = 4, "online"
        host.save()
    job = Job.objects.create(
        owner=owner, cluster=host_a.cluster, name="j", strategy=strategy, program_kind="builtin",
        builtin="digits_mlp", workers=workers, ps=ps, max_restarts=max_restarts, **fields,
    )  # fmt: skip
    scheduling.schedule_cluster(job.cluster_id)
    job.refresh_from_db()
    assert job.state == JobState.STARTING, job.reason
    for task in job.current_tasks():
        apply(task, TaskEventKind.STARTED, pid=1000 + task.pk)
        apply(task, TaskEventKind.LISTENING)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


def apply(task: Task, kind: str, **fields) -> None:  # type: ignore[no-untyped-def]
    with transaction.atomic():
        Job.objects.select_for_update().get(pk=task.job_id)  # the lifecycle's lock order: job, then task
        locked = Task.objects.select_for_update(of=("self",)).select_related("job", "host").get(pk=task.pk)
        task_events.apply_event(locked, TaskEvent(task_id=task.pk, attempt=task.attempt, kind=kind, **fields))


def task_of(job: Job, type_: str, index: int, restart: int = 0) -> Task:
    return Task.objects.get(job=job, attempt=job.attempt, type=type_, index=index, restart=restart)


def test_a_worker_killed_by_a_signal_restarts_the_gang_as_the_next_attempt(alice):
    job = running_job(alice, max_restarts=2)

    apply(task_of(job, "worker", 1), TaskEventKind.EXITED, exit_code=-9)

    job.refresh_from_db()
    assert (job.state, job.restarts) == (JobState.RESTARTING, 1)
    assert job.reason == "worker 1 on {} was killed by signal 9; restarting from the last checkpoint (restart 1 of 2)" \
        .format(task_of(job, "worker", 1).host.name)  # fmt: skip
    survivor = task_of(job, "worker", 0)
    assert survivor.state == TaskState.STOPPING
    # The survivor's own failure, once its peer is gone, is part of the same restart, not a second one.
    apply(survivor, TaskEventKind.EXITED, exit_code=1)
    scheduling.schedule_cluster(job.cluster_id)

    job.refresh_from_db()
    assert (job.state, job.attempt, job.restarts) == (JobState.STARTING, 2, 1)
    assert job.reason.startswith("restart 1 of 2, after: worker 1 on")
    assert job.current_tasks().count() == 2


def test_the_gang_is_not_placed_again_while_its_old_processes_still_run(alice):
    job = running_job(alice)

    apply(task_of(job, "worker", 0), TaskEventKind.EXITED, exit_code=-9)
    scheduling.schedule_cluster(job.cluster_id)

    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.RESTARTING, 1)  # worker 1 is still being stopped


@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_a_run_that_completes_while_being_preempted_succeeds_and_is_not_trained_again(alice, strategy):
    # TF ignores SIGTERM: a gang may finish its last epoch (emptying its checkpoint) before the stop's SIGKILL. Placed
    # again, it would start over from epoch 1.
    job = running_job(alice, strategy=strategy, ps=1 if strategy == "parameter_server" else 0)
    with transaction.atomic():
        assert lifecycle.preempt(job.pk, by=job.pk + 1, why="a lower priority class", protection=NO_BOUND)
    speaker = task_of(job, *speaks_for_job(job.strategy))
    others = [task for task in job.current_tasks() if task.pk != speaker.pk]

    apply(speaker, TaskEventKind.EXITED, exit_code=0)
    job.refresh_from_db()
    assert (job.state, job.ending) == (JobState.PREEMPTED, JobState.SUCCEEDED)  # its other tasks are still stopping
    for task in others:
        apply(task, TaskEventKind.EXITED, exit_code=-9)
    scheduling.schedule_cluster(job.cluster_id)

    job.refresh_from_db()
    assert (job.state, job.attempt, job.restarts) == (JobState.SUCCEEDED, 1, 0)
    assert job.reason == f"{speaker.label} exited 0 (its run completed before the preemption's stop took effect)"


def test_a_preempted_gang_whose_tasks_are_killed_goes_back_to_the_queue(alice):
    job = running_job(alice)
    with transaction.atomic():
        lifecycle.preempt(job.pk, by=job.pk + 1, why="a lower priority class", protection=NO_BOUND)
    for task in job.current_tasks():
        apply(task, TaskEventKind.EXITED, exit_code=-9)

    job.refresh_from_db()
    assert (job.state, job.ending, job.attempt) == (JobState.PREEMPTED, "", 1)


def test_a_program_error_fails_the_job_without_a_restart_once_its_peers_end_too(alice):
    job = running_job(alice, max_restarts=3)
    failed = task_of(job, "worker", 0)

    apply(failed, TaskEventKind.EXITED, exit_code=1)

    # Its peer still runs on another host, whose loss could have caused this: the verdict waits, saying so.
    job.refresh_from_db()
    assert (job.state, job.ending, job.restarts) == (JobState.RUNNING, JobState.FAILED, 0)
    assert job.reason == f"{failed.label} exited with code 1" + lifecycle.awaiting_peers(lifecycle.peer_word_wait())
    assert task_of(job, "worker", 1).state == TaskState.RUNNING
    apply(task_of(job, "worker", 1), TaskEventKind.EXITED, exit_code=1)  # the same bug in the peer

    job.refresh_from_db()
    assert (job.state, job.reason, job.restarts, job.failed_task_id) == (
        JobState.FAILED, f"{failed.label} exited with code 1", 0, failed.pk
    )  # fmt: skip


def test_a_program_error_whose_peers_go_on_fails_the_job_after_the_wait_and_stops_them(alice):
    job = running_job(alice, max_restarts=3)
    failed = task_of(job, "worker", 0)
    apply(failed, TaskEventKind.EXITED, exit_code=1)
    reaping.reap_finished_jobs()
    assert Job.objects.get(pk=job.pk).ending == JobState.FAILED  # still within the wait

    just_inside = timezone.now() - lifecycle.peer_word_wait() - timedelta(seconds=1)
    Job.objects.filter(pk=job.pk).update(ending_at=just_inside)  # the wait has passed, every host still answering
    reaping.reap_finished_jobs()

    job.refresh_from_db()
    assert (job.state, job.reason, job.ending) == (JobState.FAILED, f"{failed.label} exited with code 1", "")
    assert task_of(job, "worker", 1).state == TaskState.STOPPING


def test_a_permanent_exit_caused_by_a_lost_peer_host_restarts_the_job(alice):
    job = running_job(alice, max_restarts=1)
    survivor, lost = task_of(job, "worker", 1), task_of(job, "worker", 0)
    # The chief's host is gone: its survivor exits 1 (UnavailableError) before the host's heartbeats are missed.
    apply(survivor, TaskEventKind.EXITED, exit_code=1)

    host_lost(lost.host_id, lost.host.name)

    job.refresh_from_db()
    assert (job.state, job.ending, job.restarts) == (JobState.RESTARTING, "", 1)
    assert job.restart_reason == f"host {lost.host.name} went offline; lost {lost}"
    assert job.failed_task_id == lost.pk


def test_with_no_restart_left_a_program_error_fails_at_once(alice):
    job = running_job(alice, strategy="multi_worker_mirrored", workers=2, max_restarts=0)

    apply(task_of(job, "worker", 0), TaskEventKind.EXITED, exit_code=1)

    # No restart is left: a lost host could not change the verdict, so nothing waits for one.
    job.refresh_from_db()
    assert (job.state, job.reason) == (JobState.FAILED, "worker 0 on {} exited with code 1".format(
        task_of(job, "worker", 0).host.name))  # fmt: skip


def test_when_restarts_are_used_up_the_job_fails_saying_so(alice):
    job = running_job(alice, max_restarts=0)

    apply(task_of(job, "worker", 1), TaskEventKind.EXITED, exit_code=-9)

    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.reason.endswith("was killed by signal 9")  # no restarts allowed: nothing more to say


def test_a_parameter_server_worker_is_relaunched_in_place_and_the_job_goes_on(alice):
    job = running_job(alice, strategy="parameter_server", workers=2, ps=1, max_restarts=1)
    victim = task_of(job, "worker", 1)

    apply(victim, TaskEventKind.EXITED, exit_code=-9)

    job.refresh_from_db()
    assert (job.state, job.restarts) == (JobState.RUNNING, 1)
    again = task_of(job, "worker", 1, restart=1)
    assert (again.host_id, again.port, again.tf_config) == (victim.host_id, victim.port, victim.tf_config)
    assert again.state == TaskState.PENDING
    # A second loss with no restarts left: still going, without that worker.
    apply(again, TaskEventKind.STARTED, pid=4242)
    apply(again, TaskEventKind.EXITED, exit_code=-9)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert "training goes on without it (all 1 restarts used)" in job.reason


def test_the_job_page_counts_restarts_per_task_from_what_happened(alice, client):
    """A ParameterServer worker relaunched in place: restarts 1 on its row, 0 on every other; a gang restart of a
    MultiWorkerMirrored job: 1 on every row of the next placement."""
    client.force_login(alice)
    job = running_job(alice, strategy="parameter_server", workers=2, ps=1, max_restarts=1)
    apply(task_of(job, "worker", 1), TaskEventKind.EXITED, exit_code=-9)

    rows = restarts_shown(client.get(f"/jobs/{job.pk}/").content.decode())
    assert rows == {"chief 0": "0", "worker 0": "0", "worker 1": "1", "ps 0": "0"}
    assert "<dt>Restarts</dt><dd>1 of 1 allowed</dd>" in client.get(f"/jobs/{job.pk}/").content.decode()

    gang = running_job(alice, max_restarts=2)
    apply(task_of(gang, "worker", 0), TaskEventKind.EXITED, exit_code=-9)
    for task in Task.objects.filter(job=gang, attempt=1):
        apply(task, TaskEventKind.EXITED, exit_code=-9)
    scheduling.schedule_cluster(gang.cluster_id)
    gang.refresh_from_db()
    assert gang.attempt == 2
    assert restarts_shown(client.get(f"/jobs/{gang.pk}/").content.decode()) == {"worker 0": "1", "worker 1": "1"}


def test_a_relaunched_slot_keeps_its_count_through_a_gang_restart_and_a_port_conflict_adds_nothing(alice, client):
    client.force_login(alice)
    job = running_job(alice, strategy="parameter_server", workers=2, ps=1, max_restarts=2)
    apply(task_of(job, "worker", 1), TaskEventKind.EXITED, exit_code=-9)  # relaunched in place: restart 1 of 2
    apply(task_of(job, "chief", 0), TaskEventKind.EXITED, exit_code=-9)  # the gang: restart 2 of 2
    for task in Task.objects.filter(job=job, attempt=1):
        apply(task, TaskEventKind.EXITED, exit_code=-9)
    scheduling.schedule_cluster(job.cluster_id)
    job.refresh_from_db()
    assert (job.attempt, job.restarts) == (2, 2)
    # Worker 1's slot was started again twice (in place, then with the gang); every other slot once.
    rows = restarts_shown(client.get(f"/jobs/{job.pk}/").content.decode())
    assert rows == {"chief 0": "1", "worker 0": "1", "worker 1": "2", "ps 0": "1"}

    # A port taken on a host: the whole gang is placed again, and no process of it was restarted.
    fresh = running_job(alice, max_restarts=1)
    apply(task_of(fresh, "worker", 1), TaskEventKind.PORT_CONFLICT, detail="Address already in use")
    scheduling.schedule_cluster(fresh.cluster_id)
    fresh.refresh_from_db()
    assert (fresh.attempt, fresh.restarts, fresh.state) == (2, 0, JobState.STARTING)
    page = client.get(f"/jobs/{fresh.pk}/").content.decode()
    assert restarts_shown(page) == {"worker 0": "0", "worker 1": "0"}
    assert "<dt>Restarts</dt><dd>0 of 1 allowed</dd>" in page


def restarts_shown(page: str) -> dict[str, str]:
    """Task label -> the Restarts cell of its row in the job page's task table."""
    rows = re.findall(r'data-task-label="([^"]+)".*?<td class="restarts">(\d+)</td>', page, flags=re.S)
    return dict(rows)


def test_a_lost_ps_restarts_the_whole_job(alice):
    job = running_job(alice, strategy="parameter_server", workers=1, ps=1, max_restarts=1)

    apply(task_of(job, "ps", 0), TaskEventKind.EXITED, exit_code=-9)

    job.refresh_from_db()
    assert job.state == JobState.RESTARTING


def test_a_lost_host_restarts_the_job_on_what_is_left_or_queues_it_with_the_reason(alice):
    job = running_job(alice, max_restarts=1)
    lost = task_of(job, "worker", 1)
    lost.host.status = "offline"
    lost.host.save()

    host_lost(lost.host_id, lost.host.name)
    apply(task_of(job, "worker", 0), TaskEventKind.EXITED, exit_code=-9)  # the stopped survivor
    scheduling.schedule_cluster(job.cluster_id)

    job.refresh_from_db()
    # The one host left has 4 slots: both workers fit there, as attempt 2.
    assert (job.state, job.attempt) == (JobState.STARTING, 2), job.reason
    assert {t.host_id for t in job.current_tasks()} == {task_of(job, "worker", 0).host_id}


def test_a_job_with_no_progress_for_its_timeout_is_failed_with_the_reason(alice):
    job = running_job(alice, max_restarts=0, progress_timeout_s=30)
    TaskLogLine.objects.create(task=task_of(job, "worker", 0), seq=0, stream="stdout", text="started")

    assert hangs.check_progress() == []  # first look: the mark is taken now
    Job.objects.filter(pk=job.pk).update(progress_at=timezone.now() - timedelta(seconds=29))
    assert hangs.check_progress() == []
    TaskLogLine.objects.create(task=task_of(job, "worker", 0), seq=1, stream="stdout", text="still alive")
    Job.objects.filter(pk=job.pk).update(progress_at=timezone.now() - timedelta(seconds=31))
    assert hangs.check_progress() == []  # a new line is progress: the clock starts again
    Job.objects.filter(pk=job.pk).update(progress_at=timezone.now() - timedelta(seconds=31))

    assert hangs.check_progress() == [job.pk]

    job.refresh_from_db()
    assert (job.state, job.reason) == (JobState.FAILED, "no progress for 30 s (no metric point or log line)")
    assert set(job.current_tasks().values_list("state", flat=True)) == {TaskState.STOPPING}


def test_a_hung_job_with_restarts_left_is_restarted(alice):
    job = running_job(alice, max_restarts=1, progress_timeout_s=30)
    hangs.check_progress()
    Job.objects.filter(pk=job.pk).update(progress_at=timezone.now() - timedelta(seconds=31))

    hangs.check_progress()

    job.refresh_from_db()
    assert job.state == JobState.RESTARTING
    assert job.reason.startswith("no progress for 30 s")
