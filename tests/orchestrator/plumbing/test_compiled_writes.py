"""A save compiled once (orchestrator/plumbing/compiled_writes.py) writes what `save(update_fields=...)` writes, every
time: the named fields with the instance's values now (JSON, foreign keys and None included), nothing else, one
statement, with the signals the pages rely on; an expression still goes through Django's save; a gone row is an
error."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError
from django.db.models import F
from django.db.models.signals import post_save

from orchestrator.models import Job, Task
from orchestrator.plumbing.compiled_writes import save_fields
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def tasks(alice) -> list[Task]:  # type: ignore[no-untyped-def]
    return factories.gang(alice, 2)


def test_it_writes_the_named_fields_and_nothing_else(tasks, django_assert_num_queries):
    states = ["starting", "running", "stopping"]
    for n, task in enumerate([*tasks, tasks[0]]):  # the second save of a shape runs the compiled statement
        task.state, task.pid, task.event_seq = states[n], 1000 + n, 7 + n
        task.exit_waiting = {"kind": "exited", "n": n} if n != 1 else None
        task.detail = "not saved"  # in memory only: not among the fields
        with django_assert_num_queries(1):
            save_fields(task, ["state", "pid", "event_seq", "exit_waiting"])
        row = Task.objects.values("state", "pid", "event_seq", "exit_waiting", "detail").get(pk=task.pk)
        assert row == {"state": task.state, "pid": task.pid, "event_seq": task.event_seq,
                       "exit_waiting": task.exit_waiting, "detail": ""}  # fmt: skip


def test_a_foreign_key_set_by_instance_is_written(tasks):
    job = tasks[0].job
    job.failed_task, job.reason = tasks[1], "worker 1 failed"
    save_fields(job, ["failed_task", "reason"])
    save_fields(job, ["failed_task", "reason"])
    assert Job.objects.values_list("failed_task_id", "reason").get(pk=job.pk) == (tasks[1].pk, "worker 1 failed")
    job.failed_task = None
    save_fields(job, ["failed_task", "reason"])
    assert Job.objects.values_list("failed_task_id", flat=True).get(pk=job.pk) is None


def test_the_save_signals_are_sent_as_django_sends_them(tasks):
    seen: list[dict[str, Any]] = []

    def record(sender: Any, **kwargs: Any) -> None:
        seen.append({"sender": sender, **kwargs})

    post_save.connect(record, sender=Task, weak=False)
    try:
        save_fields(tasks[0], ["state"])
    finally:
        post_save.disconnect(record, sender=Task)
    assert len(seen) == 1
    assert seen[0]["instance"] is tasks[0]
    assert (seen[0]["created"], seen[0]["update_fields"], seen[0]["raw"]) == (False, frozenset({"state"}), False)


def test_an_expression_goes_through_djangos_save(tasks):
    task = tasks[0]
    task.event_seq = F("event_seq") + 5
    save_fields(task, ["event_seq"])
    assert Task.objects.values_list("event_seq", flat=True).get(pk=task.pk) == 5


def test_a_row_gone_is_an_error(tasks):
    task = tasks[0]
    Task.objects.filter(pk=task.pk).delete()
    task.state = "running"
    with pytest.raises(DatabaseError, match="did not affect any rows"):
        save_fields(task, ["state"])
