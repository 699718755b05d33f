"""A task's `started_at` is when its agent launched the process (the STARTED event's own time), not when the control
plane got round to applying the event; an agent's clock that is off cannot move it before the task was placed or
after the event was applied. Real PostgreSQL, the events applied as orchestrator/agents/events.py hands them in."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from contracts.task_messages import TaskEventKind
from orchestrator.models import Job, JobState, Task
from orchestrator.scheduler import scheduling
from tests import factories
from tests.orchestrator.jobs.test_restarts import apply

pytestmark = pytest.mark.django_db(transaction=True)


def placed_task(owner) -> Task:  # type: ignore[no-untyped-def]
    """The chief of a one-worker MultiWorkerMirrored job, placed by the scheduler and not started yet."""
    host, _ = factories.host(port_min=25200)
    host.cpu_slots, host.status = 4, "online"
    host.save()
    job = Job.objects.create(
        owner=owner, cluster=host.cluster, name="j", strategy="multi_worker_mirrored", program_kind="builtin",
        builtin="digits_mlp", workers=1,
    )  # fmt: skip
    scheduling.schedule_cluster(job.cluster_id)
    job.refresh_from_db()
    assert job.state == JobState.STARTING, job.reason
    task = job.current_tasks()[0]
    assert task.placed_at is not None and task.started_at is None
    return task


def started_at(task: Task) -> datetime:
    task.refresh_from_db()
    assert task.started_at is not None
    return task.started_at


# LISTENING may overtake STARTED (which is then dropped as older): it dates the start by its own time.
@pytest.mark.parametrize("kind", [TaskEventKind.STARTED, TaskEventKind.LISTENING])
def test_a_start_applied_late_keeps_the_time_the_agent_launched_the_process(alice, kind):
    task = placed_task(alice)
    # The agent launched it 2 s after placement; the event is applied 30 s after that (a backlog, a restart).
    Task.objects.filter(pk=task.pk).update(placed_at=timezone.now() - timedelta(seconds=32))
    launched = time.time() - 30

    apply(task, kind, pid=4242, at=launched)

    assert abs(started_at(task).timestamp() - launched) < 0.001
    assert started_at(task) < datetime.now(UTC) - timedelta(seconds=29)


def test_an_agent_clock_ahead_or_behind_is_bounded_by_placement_and_now(alice):
    ahead = placed_task(alice)
    before = timezone.now()
    apply(ahead, TaskEventKind.STARTED, pid=1, at=time.time() + 3600)  # its host's clock is an hour fast
    assert before <= started_at(ahead) <= timezone.now()

    behind = placed_task(alice)
    behind.refresh_from_db()
    apply(behind, TaskEventKind.STARTED, pid=2, at=time.time() - 3600)  # an hour slow: before it was even placed
    assert started_at(behind) == behind.placed_at


@pytest.mark.parametrize("at", [float("nan"), 1e300, "soon"])
def test_a_start_time_that_is_no_time_reads_as_when_it_was_applied(alice, at):
    task = placed_task(alice)
    before = timezone.now()
    apply(task, TaskEventKind.STARTED, pid=3, at=at)
    assert before <= started_at(task) <= timezone.now()
