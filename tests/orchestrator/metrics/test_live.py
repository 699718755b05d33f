"""The after-commit hints to a job's pages: sent once the change commits, never for a change rolled back, and at most
one of each kind per job and transaction, however many rows the transaction saved."""

from __future__ import annotations

import pytest
from django.db import transaction

from orchestrator.jobs import lifecycle
from orchestrator.metrics import live
from orchestrator.models import Job, JobState, Task
from orchestrator.scheduler import scheduling
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """What reaches the channel layer: (job, frame type), in order."""
    frames: list[tuple[int, str]] = []
    monkeypatch.setattr(live, "publish", lambda job_id, frame: frames.append((job_id, frame["type"])))
    monkeypatch.setattr(live, "publish_many", lambda many: frames.extend((job_id, f["type"]) for job_id, f in many))
    return frames


def a_job(owner, **fields) -> Job:  # type: ignore[no-untyped-def]
    host, _token = factories.host(port_min=26000)
    host.cpu_slots, host.status = 4, "online"
    host.save()
    return Job.objects.create(
        owner=owner, cluster=host.cluster, name="j", strategy="multi_worker_mirrored", program_kind="builtin",
        builtin="digits_mlp", **fields,
    )  # fmt: skip


def test_a_transaction_that_saves_a_job_and_its_tasks_sends_one_hint_per_job_after_it_commits(alice, sent):
    job, other = a_job(alice, workers=2), a_job(alice)
    sent.clear()

    with transaction.atomic():
        job.save()
        tasks = [Task.objects.create(job=job, type="worker", index=i) for i in range(2)]
        for task in tasks:
            task.state = "running"
            task.save()
        other.save()
        live.logs_stored(job.pk)
        live.logs_stored(job.pk)
        assert sent == []  # nothing before the commit

    expected = [(job.pk, live.JOB_CHANGED), (other.pk, live.JOB_CHANGED), (job.pk, live.LOGS_STORED)]
    assert sorted(sent) == sorted(expected)


def test_a_rolled_back_change_sends_nothing_and_does_not_silence_the_next_one(alice, sent):
    job = a_job(alice)
    sent.clear()

    with transaction.atomic():
        job.save()
        transaction.set_rollback(True)
    assert sent == []

    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint that rolls back takes its hint with it
                job.save()
                raise RuntimeError
        except RuntimeError:
            pass
        assert sent == []
        job.save()  # so this change must send its own
    assert sent == [(job.pk, live.JOB_CHANGED)]

    job.save()  # no transaction: at once
    assert sent == [(job.pk, live.JOB_CHANGED)] * 2


def test_placing_a_job_and_cancelling_it_each_send_one_hint(alice, sent):
    job = a_job(alice, workers=4)
    sent.clear()

    scheduling.schedule_cluster(job.cluster_id)
    job.refresh_from_db()
    assert job.state == JobState.STARTING and job.tasks.count() == 4
    assert sent == [(job.pk, live.JOB_CHANGED)]

    assert lifecycle.cancel(job.pk, by="alice")
    assert sent == [(job.pk, live.JOB_CHANGED)] * 2
