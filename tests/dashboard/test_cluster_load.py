"""The cluster page's live columns: device slots used and free as the scheduler counts them, and each host's latest
CPU, memory and GPU sample (only while the host is online and the sample fresh)."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from orchestrator.models import Host, HostSample, Job, Task
from tests import factories

pytestmark = pytest.mark.django_db


def online(host: Host, **fields) -> None:
    Host.objects.filter(pk=host.pk).update(status="online", last_heartbeat=timezone.now(), **fields)


def test_it_counts_slots_held_by_active_tasks(client, alice):
    host, _ = factories.host("cpu-1")
    online(host, cpu_count=8, cpu_slots=4)
    job = Job.objects.create(owner=alice, cluster=host.cluster, name="j", strategy="mirrored", program_kind="script")
    Task.objects.create(job=job, type="worker", index=0, host=host, port=24000, devices=[0, 1], state="running")
    Task.objects.create(job=job, type="worker", index=1, host=host, port=24001, devices=[2], state="succeeded")
    client.force_login(alice)

    rows = client.get("/clusters/hosts/").content.decode()

    assert 'data-host="cpu-1" data-status="online" data-slots="4" data-slots-used="2"' in rows
    assert "2 used / 2 free" in rows
    assert '<span class="slots-free">2</span> of 4 device slots free' in rows


def test_it_shows_the_latest_fresh_sample_of_an_online_host(client, alice):
    host, _ = factories.host("gpu-1")
    online(host, gpus=[{"index": 0, "name": "H100", "memory_total_mb": 81920, "uuid": "x"}])
    now = time.time()
    HostSample.objects.create(host=host, ts=now - 30, cpu_percent=5.0, memory_used_mb=1000, memory_total_mb=64000)
    HostSample.objects.create(
        host=host,
        ts=now - 1,
        cpu_percent=73.4,
        memory_used_mb=16384,
        memory_total_mb=65536,
        gpus=[{"index": 0, "utilization_percent": 91.0, "memory_used_mb": 30000, "memory_total_mb": 81920}],
    )
    client.force_login(alice)

    rows = client.get("/clusters/hosts/").content.decode()

    assert "73 %" in rows
    assert "16.0 GiB of 64.0 GiB" in rows and "(25 %)" in rows
    assert "GPU 0: 91 % · 30000/81920 MiB" in rows


def test_a_stale_sample_or_an_offline_host_shows_no_load(client, alice):
    stale, _ = factories.host("stale-1")
    online(stale)
    HostSample.objects.create(host=stale, ts=time.time() - 3600, cpu_percent=55.0)
    down, _ = factories.host("down-1", port_min=25000)
    Host.objects.filter(pk=down.pk).update(status="offline")
    HostSample.objects.create(host=down, ts=time.time(), cpu_percent=66.0)
    client.force_login(alice)

    rows = client.get("/clusters/hosts/").content.decode()

    assert "55 %" not in rows and "66 %" not in rows


def test_staff_get_admin_links_for_each_host(admin_client):
    host, _ = factories.host("up-1")

    rows = admin_client.get("/clusters/hosts/").content.decode()

    assert f'href="/admin/orchestrator/host/{host.pk}/change/"' in rows


def test_a_large_cluster_is_shown_a_page_of_hosts_at_a_time_and_counted_whole(client, alice):
    from dashboard.page_data import HOSTS_PER_PAGE

    for i in range(HOSTS_PER_PAGE + 5):
        host, _ = factories.host(f"big-{i:03d}")
        online(host, cpu_count=2)
    client.force_login(alice)

    first = client.get("/clusters/").content.decode()
    assert first.count("<tr data-host=") == HOSTS_PER_PAGE
    assert f"{HOSTS_PER_PAGE + 5} of {HOSTS_PER_PAGE + 5} hosts online" in first  # the summary counts every host
    assert 'href="?page=2"' in first

    second = client.get("/clusters/hosts/?page=2").content.decode()
    assert second.count("<tr data-host=") == 5
    assert 'data-host="big-104"' in second and 'data-host="big-000"' not in second
    assert "page 2 of 2" in second
    # The live refresh of page 2 keeps asking for page 2; a page past the end shows the last one.
    assert 'hx-get="/clusters/hosts/?page=2"' in client.get("/clusters/?page=2").content.decode()
    assert client.get("/clusters/hosts/?page=99").content.decode().count("<tr data-host=") == 5
