"""What a scheduler pass reads and writes of its rows: it places on the GPUs a host reports, by their index (of the
GPU facts it reads only the indexes), and it writes a waiting job's reason when the reason changes, and only then
(a gang still being stopped keeps its story). Real PostgreSQL rows."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from orchestrator.models import Job, JobState, PriorityClass, Task
from orchestrator.scheduler import scheduling, waiting_reasons
from tests import factories

pytestmark = pytest.mark.django_db

GPU = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81_559}


def gpu_host(indexes: list[int]):  # type: ignore[no-untyped-def]
    host, _token = factories.host()
    host.gpus = [{"index": i, **GPU, "uuid": f"GPU-{i}"} for i in indexes]
    host.status = "online"
    host.save()
    return host


def mirrored(owner, host, devices: int, name: str = "j") -> Job:  # type: ignore[no-untyped-def]
    return Job.objects.create(
        owner=owner, cluster=host.cluster, name=name, strategy="mirrored", program_kind="builtin",
        builtin="digits_mlp", workers=1, devices_per_worker=devices, time_limit_s=600,
        priority_class=PriorityClass.objects.get(name="normal"),
    )  # fmt: skip


def row_version(job: Job) -> str:
    """The row's xmin: every UPDATE of the row, whatever it sets, changes it."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT xmin::text FROM {Job._meta.db_table} WHERE id = %s", [job.pk])  # noqa: S608
        return cursor.fetchone()[0]


def test_a_pass_places_on_the_gpus_a_host_reports_by_their_index(alice):
    # Three GPUs, not numbered 0..2 (one left out of the agent's view, say): the devices are the indexes it reported.
    host = gpu_host([0, 2, 5])
    too_wide = mirrored(alice, host, 4, "four GPUs")
    fits = mirrored(alice, host, 3, "three GPUs")

    scheduling.schedule_cluster(host.cluster_id)

    assert Job.objects.get(pk=fits.pk).state == JobState.STARTING
    assert Task.objects.get(job=fits).devices == [0, 2, 5]
    waiting = Job.objects.get(pk=too_wide.pk)
    assert waiting.state == JobState.FAILED and "can never run" in waiting.reason  # 3 GPUs is all the cluster has


def test_a_reason_is_written_when_it_changes_and_only_then(alice, settings, monkeypatch):
    settings.TFDASH_BACKFILL_DEPTH = 1  # the second waiting job gets no reservation: it is told it waits its turn
    monkeypatch.setattr(scheduling, "PLAN_EVERY_S", 0.0)  # every pass tells every waiting job
    host = gpu_host([0])
    mirrored(alice, host, 1, "holds the GPU")
    scheduling.schedule_cluster(host.cluster_id)
    mirrored(alice, host, 1, "reserved for")
    waits = mirrored(alice, host, 1, "waits its turn")
    scheduling.schedule_cluster(host.cluster_id)
    assert Job.objects.get(pk=waits.pk).reason == waiting_reasons.WAITING_UNRESERVED
    version = row_version(waits)

    scheduling.schedule_cluster(host.cluster_id)  # nothing changed: nothing written
    assert row_version(waits) == version

    # A reason that is not the pass's (staff wrote one, an older release said it otherwise) is written over.
    Job.objects.filter(pk=waits.pk).update(reason="réservé — 予約 ✓")
    scheduling.schedule_cluster(host.cluster_id)
    assert Job.objects.get(pk=waits.pk).reason == waiting_reasons.WAITING_UNRESERVED


def test_a_gang_still_stopping_keeps_its_reason_and_loses_its_planned_start(alice):
    host = gpu_host([0, 1])
    job = mirrored(alice, host, 1, "restarting")
    Task.objects.create(job=job, type="worker", index=0, host=host, port=24000, devices=[0], state="stopping")
    story = "restart 1 of 2, after: worker 0 on h-1 exited with code 1"
    Job.objects.filter(pk=job.pk).update(
        state=JobState.RESTARTING, attempt=1, reason=story, expected_start=timezone.now(), reservation={"at": "x"}
    )

    scheduling.schedule_cluster(host.cluster_id)

    job.refresh_from_db()
    assert (job.state, job.reason, job.expected_start, job.reservation) == (JobState.RESTARTING, story, None, {})
