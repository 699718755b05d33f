"""Host samples are checked like reports (contracts/host_samples.py): a sample of the wrong types or sizes is refused
at the ingest (counted), the rest of its report stored; and a bad sample stored before that check (an old row) never
fails the cluster page or the job page's host charts."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from contracts.host_samples import MAX_GPU_PROCESSES
from contracts.limits import MAX_HOST_GPUS
from contracts.protocol import HOST_SAMPLES
from orchestrator.metrics import ingest
from orchestrator.models import Host, HostSample, Task
from orchestrator.plumbing import counters
from tests import factories
from tests.orchestrator.metrics.conftest import envelope

pytestmark = pytest.mark.django_db

GPU = {"index": 0, "name": "H100", "utilization_percent": 91.0, "memory_used_mb": 30000, "memory_total_mb": 81920}


def sample(ts: float, **changes: Any) -> dict[str, Any]:
    """A sample as the agent's sampler takes it (worker_agent/sampler.py), with `changes`."""
    return {
        "ts": ts,
        "cpu_percent": 73.4,
        "memory_used_mb": 16384,
        "memory_total_mb": 65536,
        "gpu_error": "",
        "gpus": [{**GPU, "temperature_c": 60.0, "power_w": 300.5, "processes": [{"pid": 4242, "used_memory_mb": 1}]}],
        **changes,
    }


def with_gpu(ts: float, **gpu: Any) -> dict[str, Any]:
    return sample(ts, gpus=[{**GPU, **gpu}])


@pytest.fixture
def watched(running, client):  # type: ignore[no-untyped-def]
    """The running task's host online and the task started (so its job's page shows the host); alice signed in."""
    owner, host, token, job, task = running
    Host.objects.filter(pk=host.pk).update(status="online", last_heartbeat=timezone.now())
    Task.objects.filter(pk=task.pk).update(started_at=timezone.now() - timedelta(seconds=30))
    client.force_login(owner)
    return host, token, job


def test_a_sample_of_the_wrong_shape_is_refused_at_the_ingest_and_the_pages_show_the_good_ones(watched, client):
    host, token, job = watched
    now = time.time()
    bad = [
        with_gpu(now - 9, index="x"),
        with_gpu(now - 9, index=True),
        with_gpu(now - 9, index=-1),
        with_gpu(now - 9, utilization_percent="high"),
        with_gpu(now - 9, memory_used_mb=2.5),
        with_gpu(now - 9, name="n" * 10_000),
        with_gpu(now - 9, processes=[{"pid": 1}] * (MAX_GPU_PROCESSES + 1)),
        sample(now - 9, gpus=[GPU] * (MAX_HOST_GPUS + 1)),
        sample(now - 9, gpus=["a GPU"]),
        sample(now - 9, gpus={"0": GPU}),
        sample(now - 9, cpu_percent=1e9),
        sample("yesterday"),
        ["not", "a", "sample"],
    ]
    refused = counters.get(ingest.SAMPLES_REFUSED)

    stored = ingest.store_reports([(HOST_SAMPLES, envelope(host, token, {"samples": [*bad, sample(now - 1)]}))])

    assert stored.samples == 1
    assert counters.get(ingest.SAMPLES_REFUSED) - refused == len(bad)
    assert list(HostSample.objects.filter(host=host).values_list("ts", flat=True)) == [now - 1]
    page = client.get("/clusters/")
    assert page.status_code == 200
    assert "GPU 0: 91 % · 30000/81920 MiB" in client.get("/clusters/hosts/").content.decode()
    charts = client.get(f"/api/jobs/{job.pk}/hosts/")
    assert charts.status_code == 200
    assert [s["gpus"][0]["utilization_percent"] for s in charts.json()["samples"]] == [91.0]


def test_old_bad_rows_fail_no_page(watched, client):
    host, _token, job = watched
    now = time.time()
    # Stored before the ingest checked samples (no check stands between them and the table): anything at all.
    junk = [{"index": "x"}, {"index": None}, "a GPU", 7, {"index": 1, "utilization_percent": "high", "name": 5}, GPU]
    HostSample.objects.create(host=host, ts=now - 2, cpu_percent=10.0, gpus={"not": "a list"})
    HostSample.objects.create(host=host, ts=now - 1, cpu_percent=20.0, gpus=junk)

    assert client.get("/clusters/").status_code == 200
    rows = client.get("/clusters/hosts/")
    assert rows.status_code == 200
    assert "GPU 0: 91 %" in rows.content.decode()
    charts = client.get(f"/api/jobs/{job.pk}/hosts/")
    assert charts.status_code == 200
    first, latest = charts.json()["samples"]
    assert first["gpus"] == []
    # The entries without an integer index are left out; a reading that is no number is null.
    assert [(g["index"], g["utilization_percent"], g["name"]) for g in latest["gpus"]] == [
        (1, None, ""),
        (0, 91.0, "H100"),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_sample_stored_while_its_host_is_being_deleted_goes_with_the_host():
    # Django deletes a host's samples, then the host, in two statements: the ingest, storing an agent's report on
    # another connection, may commit a sample between them (a CI run: the host's DELETE failed on the foreign key).
    host, _token = factories.host("going")
    HostSample.objects.create(host=host, ts=1.0)
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as ingest_connection:

        def sample_stored_meanwhile(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
            if sql.startswith('DELETE FROM "orchestrator_host"'):  # its samples are deleted: the host is next
                ingest_connection.execute(
                    "INSERT INTO orchestrator_hostsample (host_id, ts, gpus) VALUES (%s, 2.0, '[]')", [host.pk]
                )
            return execute(sql, params, many, context)

        with connection.execute_wrapper(sample_stored_meanwhile):
            Host.objects.filter(pk=host.pk).delete()

    assert not Host.objects.filter(pk=host.pk).exists()
    assert not HostSample.objects.exists()
