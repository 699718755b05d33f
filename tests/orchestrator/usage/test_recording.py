"""A task's device-seconds reach the daily rollup at its end (orchestrator/usage/recording.py): devices held x
(end - placement), by device kind, to its job's owner and cluster; once, however often its end is delivered; split at
UTC midnight."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from django.db import transaction

from contracts.task_messages import TaskEventKind
from orchestrator.models import Task, UsageDay
from orchestrator.usage import recording
from tests.orchestrator.jobs.test_restarts import apply
from tests.orchestrator.usage import scenes

pytestmark = pytest.mark.django_db


def days() -> dict[tuple[date, str, str, str], tuple[float, int]]:
    return {
        (row.day, row.cluster.name, row.user.username, row.kind): (row.device_seconds, row.tasks)
        for row in UsageDay.objects.select_related("cluster", "user")
    }


def test_a_placed_task_holds_its_devices_from_its_placement(alice):
    scenes.online_host("gpu-lab", gpus=4)
    job = scenes.placed(alice, "gpu-lab", workers=2, devices=2)
    tasks = list(job.current_tasks())
    assert {t.placed_at for t in tasks} == {job.placed_at} and job.placed_at is not None
    assert not any(t.usage_recorded for t in tasks)


def test_a_task_ending_records_its_device_seconds_once_even_when_its_end_comes_twice(alice):
    scenes.online_host("gpu-lab", gpus=4)
    job = scenes.placed(alice, "gpu-lab", workers=1, devices=2)
    scenes.run(job, placed_hours_ago=1)
    task = job.current_tasks().get()
    placed_at = task.placed_at

    apply(task, TaskEventKind.EXITED, exit_code=0)
    task.refresh_from_db()
    once = days()
    # The same exit delivered again, past the agent's event clock (applied directly), and the task ended by another
    # path (a lost host's): nothing more is added.
    apply(task, TaskEventKind.EXITED, exit_code=0)
    with transaction.atomic():
        assert recording.task_ended(Task.objects.select_related("job", "host").get(pk=task.pk)) is False

    expected = 2 * (task.finished_at - placed_at).total_seconds()
    assert task.usage_recorded
    assert sum(seconds for seconds, _n in once.values()) == pytest.approx(expected)
    assert {(c, u, k) for _d, c, u, k in once} == {("gpu-lab", "alice", "gpu")}
    assert days() == once


def test_a_task_across_midnight_splits_its_seconds_between_the_days(alice):
    scenes.online_host("cpu-lab", cpu_slots=4)
    job = scenes.placed(alice, "cpu-lab", workers=1, devices=3)
    task = job.current_tasks().get()
    Task.objects.filter(pk=task.pk).update(placed_at=datetime(2026, 3, 1, 23, 30, tzinfo=UTC))
    task.refresh_from_db()
    task.finished_at = datetime(2026, 3, 2, 0, 45, tzinfo=UTC)

    with transaction.atomic():
        assert recording.task_ended(task)

    assert days() == {
        (date(2026, 3, 1), "cpu-lab", "alice", "cpu"): (3 * 1800.0, 1),
        (date(2026, 3, 2), "cpu-lab", "alice", "cpu"): (3 * 2700.0, 1),
    }


def test_tasks_that_hold_no_device_add_nothing(alice):
    scenes.online_host("cpu-lab", cpu_slots=4)
    scenes.online_host("cpu-lab", cpu_slots=4)
    job = scenes.placed(alice, "cpu-lab", workers=1, devices=1, ps=1)
    scenes.run(job, placed_hours_ago=2)
    scenes.end(job)

    worker = Task.objects.get(job=job, type="worker")
    assert {t.type: t.usage_recorded for t in Task.objects.filter(job=job)} == {
        "chief": True,
        "ps": True,
        "worker": True,
    }
    total = sum(seconds for seconds, _n in days().values())
    assert total == pytest.approx((worker.finished_at - worker.placed_at).total_seconds())


def test_two_ends_of_one_user_on_one_day_add_up_in_one_row(alice):
    for _ in range(2):
        scenes.online_host("gpu-lab", gpus=2)
    first = scenes.placed(alice, "gpu-lab", workers=1, devices=2)
    second = scenes.placed(alice, "gpu-lab", workers=1, devices=1)
    for job in (first, second):
        scenes.run(job, placed_hours_ago=0.5)
        scenes.end(job)

    rows = days()
    assert [n for _seconds, n in rows.values()] == [2]
    assert sum(seconds for seconds, _n in rows.values()) == pytest.approx(scenes.held()["alice"])
