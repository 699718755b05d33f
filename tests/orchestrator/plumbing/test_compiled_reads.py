"""A read compiled once (orchestrator/plumbing/compiled_reads.py) answers what its queryset answers, every time: the
same rows as instances with the same values, their related rows already there, the rows as they are now (only the SQL is
kept, never data), for any count of values, with the query's constant parameters kept."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.forms.models import model_to_dict

from orchestrator.models import Job, Task
from orchestrator.plumbing.compiled_reads import CompiledRead
from tests import factories

pytestmark = pytest.mark.django_db


def tasks_read(ids):  # type: ignore[no-untyped-def]
    return Task.objects.select_for_update(of=("self",)).select_related("job", "host").filter(pk__in=ids).order_by("pk")


def as_dicts(tasks: list[Task]) -> list[tuple[dict, dict, dict]]:
    return [(model_to_dict(t), model_to_dict(t.job), model_to_dict(t.host)) for t in tasks]


@pytest.fixture
def tasks(alice) -> list[Task]:  # type: ignore[no-untyped-def]
    return factories.gang(alice, 3)


def test_it_reads_what_its_queryset_reads_with_the_related_rows(tasks, django_assert_num_queries):
    read = CompiledRead(tasks_read)
    for ids in ([tasks[0].pk], [tasks[0].pk, tasks[2].pk], [t.pk for t in tasks], [tasks[1].pk]):
        with transaction.atomic():
            expected = list(tasks_read(ids))
            with django_assert_num_queries(1):  # the related job and host come with the row
                found = read(ids)
                assert as_dicts(found) == as_dicts(expected)
            assert [t.pk for t in found] == sorted(ids)


def test_each_call_reads_the_rows_as_they_are_now(tasks):
    read = CompiledRead(tasks_read)
    with transaction.atomic():
        assert read([tasks[0].pk])[0].state == "pending"
    Task.objects.filter(pk=tasks[0].pk).update(state="running")
    Job.objects.filter(pk=tasks[0].job_id).update(reason="changed")
    with transaction.atomic():
        again = read([tasks[1].pk])[0], read([tasks[0].pk])[0]  # the same count: the compiled SQL, other values
    assert (again[0].pk, again[1].pk) == (tasks[1].pk, tasks[0].pk)
    assert (again[1].state, again[1].job.reason) == ("running", "changed")
    assert read([]) == []


def test_constant_parameters_are_kept_and_values_it_cannot_find_are_refused(tasks):
    Task.objects.filter(pk=tasks[1].pk).update(state="running")
    read = CompiledRead(lambda ids: Task.objects.filter(state__in=["running", "stopping"], pk__in=ids).order_by("pk"))
    with transaction.atomic():
        assert [t.pk for t in read([tasks[0].pk, tasks[1].pk])] == [tasks[1].pk]
        assert [t.pk for t in read([tasks[1].pk, tasks[2].pk])] == [tasks[1].pk]  # the states kept, other ids
    shifted = CompiledRead(lambda ids: Task.objects.filter(pk__in=[i + 1 for i in ids]))
    with pytest.raises(ValueError, match="not a read of its values in one run"):
        shifted([tasks[0].pk])
