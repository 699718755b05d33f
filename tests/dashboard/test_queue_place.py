"""A waiting job's page says where it stands: how many jobs wait ahead of it, why the first of them does not start,
and when it starts at the latest (its reservation, from the running jobs' time limits)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orchestrator.models import Job, JobState
from orchestrator.scheduler import fleet_state, scheduling
from tests import factories

pytestmark = pytest.mark.django_db


def queued(owner, cluster, name: str, limit: int = 3600) -> Job:  # type: ignore[no-untyped-def]
    return Job.objects.create(owner=owner, cluster=cluster, name=name, strategy="mirrored", program_kind="builtin",
                              builtin="digits_mlp", workers=1, devices_per_worker=1, time_limit_s=limit)  # fmt: skip


def test_a_job_behind_the_head_shows_its_place_why_the_head_waits_and_its_latest_start(alice, bob, client):
    host, _ = factories.host()
    host.cpu_slots, host.status = 1, "online"
    host.save()
    running = queued(alice, host.cluster, "takes the only device", limit=600)
    head = queued(bob, host.cluster, "next", limit=900)
    mine = queued(alice, host.cluster, "mine")
    last = queued(alice, host.cluster, "last")

    scheduling.schedule_cluster(host.cluster_id)

    for job in (running, head, mine, last):
        job.refresh_from_db()
    assert running.state == JobState.STARTING
    # The head starts when the running job reaches its limit (plus its stop grace and a scheduling interval); the next
    # when the head reaches its own.
    grace = timedelta(seconds=fleet_state.release_margin(host.cluster))
    assert head.state == JobState.QUEUED and head.expected_start == running.placed_at + timedelta(seconds=600) + grace
    assert head.reason.startswith(f"waiting for 1 device(s): reserved on {host.name} from ")
    assert head.reservation["hosts"] == {host.name: [0]}
    assert mine.expected_start == head.expected_start + timedelta(seconds=900) + grace
    client.force_login(alice)
    page = client.get(f"/jobs/{mine.pk}/").content.decode()
    assert f"1 job ahead in the queue; the first, #{head.pk}, waits: {head.reason}." in page
    assert 'id="expected-start"' in page and f"Starts by {mine.expected_start:%Y-%m-%d %H:%M:%S}" in page
    assert f"2 jobs ahead in the queue; the first, #{head.pk}" in client.get(f"/jobs/{last.pk}/").content.decode()
    client.force_login(bob)
    assert 'id="queue-place"' not in client.get(f"/jobs/{head.pk}/").content.decode()  # it is the first
    client.force_login(alice)
    assert 'id="queue-place"' not in client.get(f"/jobs/{running.pk}/").content.decode()  # not waiting
