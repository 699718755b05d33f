"""Fair share with memory (issue 46): decayed usage written once as tasks end, a user who used the fleet yesterday
goes behind one who did not (within a class), the reason line says so, and the queue view's factors are the ones
orchestrator/core/fair_share.py computes (which bench/fair_share_replay.py uses too)."""

from __future__ import annotations

import math
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone
from rest_framework.test import APIClient

from contracts.task_messages import TaskEventKind
from orchestrator.core import fair_share
from orchestrator.models import DecayedUsage, Job, JobState, Quota, Task
from orchestrator.scheduler import scheduling
from tests.orchestrator.jobs.test_restarts import apply
from tests.orchestrator.scheduler.test_queue_policy import job, one_host

pytestmark = pytest.mark.django_db

DAY = 86_400.0


def test_decay_and_accrual_are_exact_and_order_free():
    h = 7 * DAY
    assert fair_share.decay(100.0, h, h) == pytest.approx(50.0)
    # One device for a whole half-life accrues h/ln2 * (1 - 1/2): the integral of the decay over the run.
    assert fair_share.accrued(1, 0.0, h, h) == pytest.approx(h / math.log(2) / 2)
    # A long run's accrual is the sum of its pieces, each decayed to the end: no history needed.
    whole = fair_share.accrued(2, 0.0, 3 * DAY, h)
    pieces = fair_share.added(
        fair_share.accrued(2, 0.0, DAY, h), DAY, fair_share.accrued(2, DAY, 3 * DAY, h), 3 * DAY, h
    )
    assert pieces[0] == pytest.approx(whole) and pieces[1] == 3 * DAY
    # Tasks ending out of order add up to the same.
    a, b = (fair_share.accrued(1, 0.0, DAY, h), DAY), (fair_share.accrued(4, DAY, 2 * DAY, h), 2 * DAY)
    one = fair_share.added(*fair_share.added(0.0, 0.0, *a, h), *b, h)
    other = fair_share.added(*fair_share.added(0.0, 0.0, *b, h), *a, h)
    assert one[0] == pytest.approx(other[0]) and one[1] == other[1]


def test_the_factor_is_slurms_classic_one():
    shares = {"a": 3.0, "b": 1.0, "idle": 1.0}
    usage = {"a": 60.0, "b": 40.0}
    f = fair_share.factors(usage, shares)
    assert f["a"] == pytest.approx(2 ** -(0.6 / 0.6))  # used exactly its share: 0.5
    assert f["b"] == pytest.approx(2 ** -(0.4 / 0.2))  # twice its share: 0.25
    assert f["idle"] == 1.0 and fair_share.factors({}, {"x": 0.0}) == {"x": 0.0}  # no share: may only borrow


def test_a_cluster_refuses_a_half_life_of_zero():
    host = one_host()
    host.cluster.fair_share_half_life_s = 0
    with pytest.raises(ValidationError, match="fair_share_half_life_s"):
        host.cluster.full_clean()


def test_a_tasks_end_adds_its_decayed_device_seconds_once(alice):
    host = one_host(devices=2)
    done = job(alice, host, "two devices for an hour", devices=2)
    scheduling.schedule_cluster(host.cluster_id)
    placed = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk=done.pk).update(placed_at=placed)
    Task.objects.filter(job=done).update(placed_at=placed)
    task = Task.objects.get(job=done)
    apply(task, TaskEventKind.STARTED, pid=4242)

    apply(task, TaskEventKind.EXITED, exit_code=0)
    apply(task, TaskEventKind.EXITED, exit_code=0)  # delivered twice: the second ends nothing

    row = DecayedUsage.objects.get(cluster=host.cluster, user=alice)
    half_life = host.cluster.fair_share_half_life_s
    assert row.value == pytest.approx(fair_share.accrued(2, placed.timestamp(), row.as_of, half_life))
    assert row.value == pytest.approx(7200, rel=0.01)  # two device-hours, barely decayed
    assert placed.timestamp() + 3600 <= row.as_of <= time.time()


def test_yesterdays_heavy_user_goes_behind_one_who_used_nothing_and_the_reason_says_so(alice, bob):
    host = one_host(devices=1)
    blocker = job(bob, host, "holds the device")
    scheduling.schedule_cluster(host.cluster_id)
    Job.objects.filter(pk=blocker.pk).update(state=JobState.RUNNING)
    # Alice ran 300 device-hours that ended yesterday; Bob's only use is the hour his running job has held so far.
    DecayedUsage.objects.create(cluster=host.cluster, user=alice, value=300 * 3600.0, as_of=time.time() - DAY)
    Job.objects.filter(pk=blocker.pk).update(placed_at=timezone.now() - timedelta(hours=1))
    alices = job(alice, host, "alice's, submitted first")
    bobs = job(bob, host, "bob's, submitted later")

    scheduling.schedule_cluster(host.cluster_id)

    queue = APIClient()
    queue.force_authenticate(alice)
    rows = queue.get(f"/api/clusters/{host.cluster_id}/queue/").json()
    assert [r["id"] for r in rows] == [bobs.pk, alices.pk]
    reason = Job.objects.get(pk=alices.pk).reason
    assert f"fair share puts #{bobs.pk} ahead of it" in reason, reason
    # The factors shown are the ones the core computes from the same usage (equal shares: no quota here).
    h = host.cluster.fair_share_half_life_s
    now = time.time()
    alice_used = fair_share.decay(300 * 3600.0, DAY, h)
    bob_used = fair_share.accrued(1, now - 3600, now, h)
    expected = fair_share.factors({"a": alice_used, "b": bob_used}, {"a": 1.0, "b": 1.0})
    by_owner = {r["owner"]: r for r in rows}
    assert by_owner["alice"]["fair_share"] == pytest.approx(expected["a"], abs=1e-3)
    assert by_owner["bob"]["fair_share"] == pytest.approx(expected["b"], abs=1e-3)
    assert by_owner["alice"]["decayed_usage_h"] == pytest.approx(alice_used / 3600, abs=0.05)


def test_within_quota_still_goes_first_whatever_the_history(alice, bob):
    host = one_host(devices=1)
    Quota.objects.create(cluster=host.cluster, user=alice, devices=1)
    blocker = job(bob, host, "bob borrows the device")
    scheduling.schedule_cluster(host.cluster_id)
    Job.objects.filter(pk=blocker.pk).update(state=JobState.RUNNING)
    DecayedUsage.objects.create(cluster=host.cluster, user=alice, value=1e7, as_of=time.time())
    alices = job(alice, host, "within her quota, heavy history")
    bobs = job(bob, host, "beyond his (none)")

    scheduling.schedule_cluster(host.cluster_id)

    rows = APIClient()
    rows.force_authenticate(alice)
    assert [r["id"] for r in rows.get(f"/api/clusters/{host.cluster_id}/queue/").json()] == [alices.pk, bobs.pk]
