"""A waiting job's page says where it stands: how many jobs wait ahead of it and why the first of them does not start
(the reason stored on the jobs behind the head does not name it, so that placing the head rewrites no queued row)."""

from __future__ import annotations

import pytest

from orchestrator.control import scheduling
from orchestrator.models import Job, JobState
from tests import factories

pytestmark = pytest.mark.django_db


def queued(owner, cluster, name: str) -> Job:  # type: ignore[no-untyped-def]
    return Job.objects.create(owner=owner, cluster=cluster, name=name, strategy="mirrored", program_kind="builtin",
                              builtin="digits_mlp", workers=1, devices_per_worker=1)  # fmt: skip


def test_a_job_behind_the_head_shows_its_place_and_why_the_head_waits(alice, bob, client):
    host, _ = factories.host()
    host.cpu_slots, host.status = 1, "online"
    host.save()
    running = queued(alice, host.cluster, "takes the only device")
    head = queued(bob, host.cluster, "next")
    mine = queued(alice, host.cluster, "mine")
    last = queued(alice, host.cluster, "last")

    scheduling.schedule_cluster(host.cluster_id)

    running.refresh_from_db()
    head.refresh_from_db()
    assert running.state == JobState.STARTING
    assert head.state == JobState.QUEUED and head.reason.startswith("needs 1 devices on one host")
    client.force_login(alice)
    page = client.get(f"/jobs/{mine.pk}/").content.decode()
    assert f"1 job ahead in the queue; the first, #{head.pk}, waits: {head.reason}." in page
    assert scheduling.WAITING_BEHIND in page
    assert f"2 jobs ahead in the queue; the first, #{head.pk}" in client.get(f"/jobs/{last.pk}/").content.decode()
    client.force_login(bob)
    assert 'id="queue-place"' not in client.get(f"/jobs/{head.pk}/").content.decode()  # it is the first
    client.force_login(alice)
    assert 'id="queue-place"' not in client.get(f"/jobs/{running.pk}/").content.decode()  # not waiting
