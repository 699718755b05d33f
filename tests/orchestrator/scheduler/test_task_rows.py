"""A pass's task rows go in by COPY, from the values the pass sets: each must be the row `bulk_create` would have
written from a Task made of the same values (the model's defaults for the rest), and the ids handed back must be those
rows'."""

from __future__ import annotations

from typing import Any

import pytest
from django.forms.models import model_to_dict
from django.utils import timezone

from orchestrator.models import Job, Task
from orchestrator.scheduler import task_rows
from tests import factories

pytestmark = pytest.mark.django_db


def test_rows_written_by_copy_are_the_rows_bulk_create_writes(alice):
    host, _token = factories.host()
    host.save()
    jobs = [
        Job.objects.create(owner=alice, cluster=host.cluster, name=f"j{i}", strategy="multi_worker_mirrored",
                           program_kind="builtin", builtin="digits_mlp", workers=2, attempt=1)
        for i in range(2)
    ]  # fmt: skip
    now = timezone.now()

    def rows(job: Job) -> list[dict[str, Any]]:
        return [
            dict(job_id=job.pk, attempt=job.attempt, type="worker", index=i, host_id=host.pk,
                 port=24000 + 10 * job.pk + i, devices=[i, 7],
                 tf_config={"cluster": {"worker": ["a:1", "b:2"]}, "task": {"index": i}}, restarts=job.pk % 2,
                 ordered_at=now)
            for i in range(2)
        ]  # fmt: skip

    copied = task_rows.insert_current(rows(jobs[0]))
    Task.objects.bulk_create([Task(**row) for row in rows(jobs[1])])

    assert sorted(copied) == sorted(Task.objects.filter(job=jobs[0]).values_list("pk", flat=True))
    assert len(copied) == 2
    left_out = {"id", "job", "port", "restarts"}  # what differs between the two jobs by construction
    by_copy = [{k: v for k, v in model_to_dict(t).items() if k not in left_out}
               for t in Task.objects.filter(job=jobs[0]).order_by("index")]  # fmt: skip
    by_insert = [{k: v for k, v in model_to_dict(t).items() if k not in left_out}
                 for t in Task.objects.filter(job=jobs[1]).order_by("index")]  # fmt: skip
    assert by_copy == by_insert
    first = Task.objects.get(job=jobs[0], index=1)
    assert (first.state, first.facts, first.detail, first.exit_waiting) == ("pending", {}, "", None)
    assert (first.devices, first.tf_config["task"], first.ordered_at) == ([1, 7], {"index": 1}, now)
