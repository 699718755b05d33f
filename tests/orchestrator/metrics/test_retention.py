"""Retention: host samples older than TFDASH_SAMPLES_FULL_S thinned to one per TFDASH_SAMPLES_THIN_S per host, by a
beat task, a bounded number of deletes a run, idempotent; newer samples and other hosts' buckets untouched."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from config.celery import app
from orchestrator import tasks  # noqa: F401  (tasks: registers the Celery entry points)
from orchestrator.metrics import retention
from orchestrator.models import HostSample
from tests import factories

pytestmark = pytest.mark.django_db

NOW = 1_800_000_000.0  # a fixed clock, on a minute boundary
DAY = 86_400


def samples(host, start: float, seconds: int, every: float = 1.0) -> None:
    HostSample.objects.bulk_create(
        HostSample(host=host, ts=start + i * every, cpu_percent=float(i)) for i in range(int(seconds / every))
    )


def kept(host, below: float | None = None) -> list[float]:
    rows = HostSample.objects.filter(host=host).order_by("ts")
    if below is not None:
        rows = rows.filter(ts__lt=below)
    return list(rows.values_list("ts", flat=True))


def test_old_samples_are_thinned_to_one_a_minute_per_host_and_new_ones_kept():
    a, _ = factories.host("node-a")
    b, _ = factories.host("node-b")
    old = NOW - 2 * DAY
    samples(a, old, 600)  # ten minutes at 1 Hz, two days ago
    samples(a, old + 7200 + 0.5, 179, every=0.5)  # two hours later, three minutes at 2 Hz (a gap to jump)
    samples(b, old + 30, 120)  # another host: its own minutes
    samples(a, NOW - 300, 300)  # the last five minutes: whole
    recent = kept(a, below=None)[-300:]

    deleted = retention.thin_host_samples(now=NOW)

    assert kept(a, below=NOW - DAY) == [old + 60 * m for m in range(10)] + [old + 7200 + 0.5, *(
        old + 7200 + 60 * m for m in (1, 2))]  # fmt: skip
    assert kept(b) == [old + 30, old + 60, old + 120]  # the earliest of each of its minutes
    assert kept(a)[-300:] == recent
    assert deleted == (600 - 10) + (358 - 3) + (120 - 3)
    assert retention.thin_host_samples(now=NOW) == 0  # idempotent


@override_settings(TFDASH_RETENTION_BATCH=100)
def test_a_run_deletes_a_bounded_number_and_later_runs_finish_the_work():
    host, _ = factories.host("node-a")
    samples(host, NOW - 2 * DAY, 600)

    runs = []
    while deleted := retention.thin_host_samples(now=NOW):
        assert deleted <= 100
        runs.append(deleted)

    assert sum(runs) == 590 and len(runs) == 6
    assert kept(host) == [NOW - 2 * DAY + 60 * m for m in range(10)]


def test_the_beat_runs_it():
    entry = settings.CELERY_BEAT_SCHEDULE["retention"]
    assert entry["task"] == "orchestrator.retention"
    assert entry["schedule"] == settings.TFDASH_RETENTION_INTERVAL_S
    assert "orchestrator.retention" in app.tasks  # registered on the orchestrator's queue (orchestrator/tasks.py)
