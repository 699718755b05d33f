"""Task events applied in batches (orchestrator/agents/events.py `handle_task_events`, as the intake reads them), with
real PostgreSQL and Redis: a gang's events in one batch drive its job as they would one by one; what cannot be trusted
or placed (a replay, another host's task, an unknown task, a malformed body) is refused alone while the rest applies;
a job whose handler raises does not cost the other jobs their events, and an outage mid-batch is retried without
applying anything twice."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
from django.db import OperationalError

from contracts.protocol import TASK_EVENT
from contracts.task_messages import TaskEvent, TaskEventKind
from orchestrator.agents import events
from orchestrator.identity import auth
from orchestrator.jobs import task_events
from orchestrator.models import Host, Job, JobState, Task, TaskState
from orchestrator.plumbing import counters
from tests import factories
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(alice):  # type: ignore[no-untyped-def]
    """Two hosts; on them two MultiWorkerMirrored jobs of two workers each (worker i of both jobs on host i), just
    placed. Returns (hosts and tokens, job 1, its tasks, job 2, its tasks)."""
    placed = [factories.host(port_min=24000 + 100 * i) for i in range(2)]
    jobs: list[tuple[Job, list[Task]]] = []
    for n in range(2):
        job = Job.objects.create(
            owner=alice, cluster=placed[0][0].cluster, name=f"j{n}", strategy="multi_worker_mirrored",
            program_kind="script", workers=2, attempt=1, state=JobState.STARTING,
        )  # fmt: skip
        tasks = [
            Task.objects.create(
                job=job, attempt=1, type="worker", index=i, host=host, port=24000 + 100 * i + n, state=TaskState.PENDING
            )
            for i, (host, _token) in enumerate(placed)
        ]
        jobs.append((job, tasks))
    return placed, jobs


class Agents:
    """What each host's agent sends: its events numbered as the agent numbers them."""

    def __init__(self, placed: list[tuple[Host, str]]) -> None:
        self.placed = {host.pk: (host, token) for host, token in placed}
        self.seq = {host.pk: 0 for host, _ in placed}

    def event(self, task: Task, kind: TaskEventKind, **fields: Any) -> dict[str, Any]:
        host, token = self.placed[task.host_id]
        self.seq[host.pk] += 1
        body = TaskEvent(task.pk, task.attempt, kind, pid=100 + task.pk, seq=self.seq[host.pk], **fields)
        return sealed(host.name, token, TASK_EVENT, asdict(body))


def states(*rows: Job | Task) -> list[str]:
    return [type(row).objects.get(pk=row.pk).state for row in rows]


def test_a_gangs_events_in_one_batch_start_and_end_its_job_and_what_cannot_apply_is_refused_alone(fleet):
    placed, [(job, tasks), (other, other_tasks)] = fleet
    agents = Agents(placed)
    started = [agents.event(t, TaskEventKind.STARTED) for t in tasks]
    listening = [agents.event(t, TaskEventKind.LISTENING) for t in tasks]

    assert events.handle_task_events(started + listening) == 4
    assert states(job, *tasks) == [JobState.RUNNING, TaskState.RUNNING, TaskState.RUNNING]
    # Each task keeps the number of the newest event applied to it (its LISTENING): an older one is a replay.
    assert [Task.objects.get(pk=t.pk).event_seq for t in tasks] == [agents.seq[t.host_id] for t in tasks]

    _a, (host_b, token_b) = placed
    refused_before = {name: counters.get(name) for name in (auth.REPLAYED, auth.MALFORMED, events.DROPPED)}
    foreign_event = sealed(host_b.name, token_b, TASK_EVENT, asdict(
        TaskEvent(other_tasks[0].pk, 1, TaskEventKind.EXITED, exit_code=1, seq=10_000)))  # fmt: skip
    unknown = sealed(host_b.name, token_b, TASK_EVENT, asdict(TaskEvent(10**9, 1, TaskEventKind.EXITED, seq=10_001)))
    not_an_id = sealed(host_b.name, token_b, TASK_EVENT, {**asdict(TaskEvent(0, 1, TaskEventKind.EXITED)),
                                                          "task_id": [1]})  # fmt: skip
    malformed = sealed(host_b.name, token_b, TASK_EVENT, {"task_id": tasks[1].pk})
    exits = [agents.event(t, TaskEventKind.EXITED, exit_code=0) for t in tasks]
    batch = [exits[0], started[0], foreign_event, unknown, not_an_id, malformed, exits[1]]

    assert events.handle_task_events(batch) == 2

    assert states(job, *tasks) == [JobState.SUCCEEDED, TaskState.SUCCEEDED, TaskState.SUCCEEDED]
    assert states(other, *other_tasks) == [JobState.STARTING, TaskState.PENDING, TaskState.PENDING]  # B's lie
    assert counters.get(auth.REPLAYED) == refused_before[auth.REPLAYED] + 1  # started[0], seen before
    assert counters.get(auth.MALFORMED) == refused_before[auth.MALFORMED] + 1
    assert counters.get(events.DROPPED) == refused_before[events.DROPPED] + 2  # the unknown task, the list


def test_a_job_whose_handler_raises_costs_the_other_jobs_nothing(fleet, monkeypatch, caplog):
    placed, [(job, tasks), (other, other_tasks)] = fleet
    agents = Agents(placed)
    batch = [agents.event(t, TaskEventKind.LISTENING) for t in tasks + other_tasks]
    real = task_events.apply_event

    def broken_for_job(task: Task, event: TaskEvent) -> None:
        if task.job_id == job.pk:
            raise RuntimeError("a bug in the state machine")
        real(task, event)

    monkeypatch.setattr(events, "apply_event", broken_for_job)
    failed_before = counters.get(events.FAILED)

    assert events.handle_task_events(batch) == 2

    assert states(other, *other_tasks) == [JobState.RUNNING, TaskState.RUNNING, TaskState.RUNNING]
    assert states(job, *tasks) == [JobState.STARTING, TaskState.PENDING, TaskState.PENDING]  # rolled back whole
    assert counters.get(events.FAILED) == failed_before + 2
    assert "a bug in the state machine" in caplog.text


def test_an_outage_mid_batch_is_retried_and_applies_each_event_once(fleet, monkeypatch):
    placed, [(job, tasks), (other, other_tasks)] = fleet
    agents = Agents(placed)
    batch = [agents.event(t, TaskEventKind.LISTENING) for t in tasks + other_tasks]
    real = task_events.apply_event
    outage = {"on": True}

    def away_for_the_second_job(task: Task, event: TaskEvent) -> None:
        if task.job_id == other.pk and outage["on"]:
            raise OperationalError("the database went away")
        real(task, event)

    monkeypatch.setattr(events, "apply_event", away_for_the_second_job)
    replayed_before = counters.get(auth.REPLAYED)

    with pytest.raises(OperationalError):  # the intake hands the same batch over again after a backoff
        events.handle_task_events(batch)
    assert states(job, other) == [JobState.RUNNING, JobState.STARTING]  # the first job's events were committed

    outage["on"] = False
    assert events.handle_task_events(batch) == 2  # the retry applies only the second job's

    assert states(other, *other_tasks) == [JobState.RUNNING, TaskState.RUNNING, TaskState.RUNNING]
    assert counters.get(auth.REPLAYED) == replayed_before + 2  # the first job's two, refused by their nonces


def test_events_after_one_that_changes_the_gang_see_its_rows_as_one_by_one_would(fleet):
    """A batch reads its job's tasks once; an exit that fails the gang writes the other tasks' rows, so the events
    behind it in the same batch must see those rows, not the ones read before it: the batch ends where the same
    events sent one at a time end (job 1 by batch, job 2 one by one)."""
    placed, [(job, tasks), (other, other_tasks)] = fleet
    agents = Agents(placed)
    for gang, one_by_one in ((tasks, False), (other_tasks, True)):
        started = [agents.event(t, TaskEventKind.STARTED) for t in gang]
        # Worker 0 fails at once; worker 1's server comes up just after, in the same batch.
        failed = agents.event(gang[0], TaskEventKind.EXITED, exit_code=1)
        then = [failed, agents.event(gang[1], TaskEventKind.LISTENING)]
        if one_by_one:
            for payload in started + then:
                events.handle_task_event(payload)
        else:
            assert events.handle_task_events(started + then) == 4

    batched, alone = states(job, *tasks), states(other, *other_tasks)
    assert batched == alone
    assert batched[0] != JobState.RUNNING and batched[2] != TaskState.RUNNING  # the failure was not undone
