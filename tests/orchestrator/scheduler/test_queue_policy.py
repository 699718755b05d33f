"""The queue a team shares: priority classes go first, a held job waits, an account under its quota goes before one
over it, a higher class (or a user reclaiming their quota) preempts, and a run past its time limit ends timed out.

Scheduler passes on real PostgreSQL rows; the agents' part (stopping processes) is another test's
(tests/orchestrator/test_preemption_e2e.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from rest_framework.test import APIClient

from orchestrator.jobs import lifecycle, time_limits
from orchestrator.models import Job, JobEvent, JobState, MetricPoint, PriorityClass, Quota, Task, TaskState
from orchestrator.scheduler import scheduling, waiting_reasons
from tests import factories

pytestmark = pytest.mark.django_db


def one_host(devices: int = 1):  # type: ignore[no-untyped-def]
    host, _ = factories.host()
    host.cpu_slots, host.status = devices, "online"
    host.save()
    return host


def job(owner, host, name: str, *, priority: str = "normal", devices: int = 1, limit: int = 3600) -> Job:  # type: ignore[no-untyped-def]
    return Job.objects.create(
        owner=owner, cluster=host.cluster, name=name, strategy="mirrored", program_kind="builtin",
        builtin="digits_mlp", workers=1, devices_per_worker=devices, time_limit_s=limit,
        priority_class=PriorityClass.objects.get(name=priority),
    )  # fmt: skip


def states(*jobs: Job) -> list[str]:
    return [Job.objects.get(pk=j.pk).state for j in jobs]


def running(*jobs: Job, minutes: float = 30) -> None:
    """The scheduler placed them `minutes` ago and their processes run: past the classes' minimum run time (5 min)."""
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
        state=JobState.RUNNING, placed_at=timezone.now() - timedelta(minutes=minutes)
    )


def tasks_gone(j: Job) -> None:
    """What the agent's exit events do for a stopped gang: its tasks end, their devices are free."""
    Task.objects.filter(job=j, state__in=[TaskState.STOPPING, TaskState.PENDING, TaskState.RUNNING]).update(
        state=TaskState.KILLED, finished_at=timezone.now()
    )


def test_a_higher_class_goes_first_and_a_held_job_waits_until_released(alice, bob):
    host = one_host(devices=1)
    normal = job(alice, host, "submitted first")
    high = job(bob, host, "submitted later, high", priority="high")

    scheduling.schedule_cluster(host.cluster_id)

    assert states(high, normal) == [JobState.STARTING, JobState.QUEUED]
    Job.objects.filter(pk=normal.pk).update(held=True)
    tasks_gone(high)
    Job.objects.filter(pk=high.pk).update(state=JobState.SUCCEEDED)
    scheduling.schedule_cluster(host.cluster_id)
    held = Job.objects.get(pk=normal.pk)
    assert held.state == JobState.QUEUED and held.reason == waiting_reasons.HELD
    Job.objects.filter(pk=normal.pk).update(held=False)
    scheduling.schedule_cluster(host.cluster_id)
    assert states(normal) == [JobState.STARTING]


def test_an_account_under_its_quota_goes_before_one_over_it(alice, bob):
    host = one_host(devices=2)
    Quota.objects.create(cluster=host.cluster, user=alice, devices=1)
    team = Group.objects.create(name="team-b")
    bob.groups.add(team)
    Quota.objects.create(cluster=host.cluster, group=team, devices=1)
    first = job(alice, host, "alice's first")
    scheduling.schedule_cluster(host.cluster_id)
    assert Job.objects.get(pk=first.pk).borrowing is False
    again = job(alice, host, "alice's second: beyond her quota")
    bobs = job(bob, host, "bob's: within his group's quota")

    scheduling.schedule_cluster(host.cluster_id)

    assert states(bobs, again) == [JobState.STARTING, JobState.QUEUED]


def test_borrowed_devices_are_reclaimed_by_preempting_the_borrower(alice, bob):
    host = one_host(devices=2)
    Quota.objects.create(cluster=host.cluster, user=alice, devices=1)
    Quota.objects.create(cluster=host.cluster, user=bob, devices=1)
    mine = job(alice, host, "within quota")
    borrowed = job(alice, host, "borrows the idle device")
    scheduling.schedule_cluster(host.cluster_id)
    assert [Job.objects.get(pk=j.pk).borrowing for j in (mine, borrowed)] == [False, True]
    running(mine, borrowed)
    bobs = job(bob, host, "bob reclaims his quota")

    scheduling.schedule_cluster(host.cluster_id)

    victim = Job.objects.get(pk=borrowed.pk)
    assert victim.state == JobState.PREEMPTED and victim.restarts == 0 and victim.preemptions == 1
    assert "borrowed beyond its owner's quota" in victim.reason
    assert states(mine) == [JobState.RUNNING]
    assert set(Task.objects.filter(job=victim).values_list("state", flat=True)) == {TaskState.STOPPING}
    assert Job.objects.get(pk=bobs.pk).reason.startswith(f"preempting #{victim.pk}")
    tasks_gone(victim)
    scheduling.schedule_cluster(host.cluster_id)
    # Bob's job takes the device; the victim waits again, with its place (its created_at) kept.
    assert states(bobs, victim) == [JobState.STARTING, JobState.PREEMPTED]
    assert Job.objects.get(pk=victim.pk).created_at == borrowed.created_at


def test_a_high_job_preempts_the_low_job_losing_the_least_work_and_the_victim_resumes_later(alice, bob):
    host = one_host(devices=2)
    old_checkpoint = job(alice, host, "low, checkpointed long ago", priority="low")
    fresh_checkpoint = job(alice, host, "low, checkpointed just now", priority="low")
    scheduling.schedule_cluster(host.cluster_id)
    running(old_checkpoint, fresh_checkpoint)
    now = timezone.now().timestamp()
    for j, ts, epoch in ((old_checkpoint, now - 600, 1), (fresh_checkpoint, now - 5, 3)):
        task = Task.objects.get(job=j)
        MetricPoint.objects.create(job=j, task=task, phase="epoch_end", name="loss", step=epoch, epoch=epoch,
                                   value=0.5, ts=ts)  # fmt: skip
    urgent = job(bob, host, "deadline", priority="high")

    scheduling.schedule_cluster(host.cluster_id)

    assert states(fresh_checkpoint, old_checkpoint) == [JobState.PREEMPTED, JobState.RUNNING]
    story = JobEvent.objects.get(job=fresh_checkpoint, kind="preempted").text
    assert story == f"preempted by #{urgent.pk} (a lower priority class) in epoch 4"
    tasks_gone(fresh_checkpoint)
    scheduling.schedule_cluster(host.cluster_id)
    assert states(urgent) == [JobState.STARTING]
    tasks_gone(urgent)
    Job.objects.filter(pk=urgent.pk).update(state=JobState.SUCCEEDED)
    scheduling.schedule_cluster(host.cluster_id)
    resumed = JobEvent.objects.get(job=fresh_checkpoint, kind="resumed")
    assert resumed.text == f"resumed on {host.name} from its last checkpoint"
    assert states(fresh_checkpoint) == [JobState.STARTING]
    # Its process says which checkpoint it restored (a peer's epoch end may have run ahead of the chief's backup).
    JobEvent.resumed_from(fresh_checkpoint.pk, 2)
    JobEvent.resumed_from(fresh_checkpoint.pk, 3)  # a replayed or later report: the line is written once
    resumed.refresh_from_db()
    assert resumed.text == f"resumed at epoch 3 on {host.name}"


def test_a_job_that_saves_at_the_stops_step_is_preempted_before_one_that_would_redo_work(alice, bob):
    host = one_host(devices=2)
    saves_at_stop = job(alice, host, "low, MWMS: saves at the stop's step", priority="low")  # the older: not the tie
    fresh_checkpoint = job(alice, host, "low, checkpointed just now", priority="low")
    scheduling.schedule_cluster(host.cluster_id)
    placed = timezone.now() - timedelta(minutes=10)  # within their limits, long before their last epoch ends
    Job.objects.filter(pk__in=[fresh_checkpoint.pk, saves_at_stop.pk]).update(state=JobState.RUNNING, placed_at=placed)
    Job.objects.filter(pk=saves_at_stop.pk).update(facts={"saves_at_stop": True})  # its epoch ended long ago
    now = timezone.now().timestamp()
    for j, ts in ((fresh_checkpoint, now - 5), (saves_at_stop, now - 300)):
        MetricPoint.objects.create(job=j, task=Task.objects.get(job=j), phase="epoch_end", name="loss", step=1,
                                   epoch=1, value=0.5, ts=ts)  # fmt: skip
    urgent = job(bob, host, "deadline", priority="high")

    scheduling.schedule_cluster(host.cluster_id)

    assert states(saves_at_stop, fresh_checkpoint) == [JobState.PREEMPTED, JobState.RUNNING]
    assert JobEvent.objects.get(job=saves_at_stop, kind="preempted").text.startswith(f"preempted by #{urgent.pk}")


def test_a_job_resumed_from_a_backup_saved_at_a_stop_says_the_epoch_and_step(alice):
    host = one_host()
    resumed = job(alice, host, "preempted mid-epoch")
    JobEvent.objects.bulk_create([JobEvent.resuming(resumed, [host.name])])
    JobEvent.resumed_from(resumed.pk, "3", 116)  # junk (not a count) changes nothing
    JobEvent.resumed_from(resumed.pk, 3, 116)  # 3 epochs and 116 steps of the 4th done: it goes on with step 117
    JobEvent.resumed_from(resumed.pk, 3, 117)  # a later report: the line is written once
    assert JobEvent.objects.get(job=resumed, kind="resumed").text == f"resumed at epoch 4, step 117 on {host.name}"


@pytest.mark.parametrize(("packing", "wide_runs"), [("pack", True), ("spread", False)])
def test_a_packing_cluster_keeps_a_whole_host_free_for_a_wide_worker(alice, packing, wide_runs):
    hosts = [one_host(devices=4) for _ in range(2)]
    hosts[0].cluster.packing = packing
    hosts[0].cluster.save(update_fields=["packing"])
    small = [job(alice, hosts[0], f"small {n}") for n in range(2)]
    scheduling.schedule_cluster(hosts[0].cluster_id)
    wide = job(alice, hosts[0], "one 4-device worker", devices=4)

    scheduling.schedule_cluster(hosts[0].cluster_id)

    assert states(*small) == [JobState.STARTING] * 2
    assert len({task.host_id for task in Task.objects.filter(job__in=small)}) == (1 if packing == "pack" else 2)
    assert states(wide) == [JobState.STARTING if wide_runs else JobState.QUEUED]


def test_a_normal_job_never_preempts_a_normal_one(alice, bob):
    host = one_host(devices=1)
    first = job(alice, host, "running")
    scheduling.schedule_cluster(host.cluster_id)
    running(first)
    waiting = job(bob, host, "waits its turn")

    scheduling.schedule_cluster(host.cluster_id)

    assert states(first, waiting) == [JobState.RUNNING, JobState.QUEUED]
    assert Job.objects.get(pk=waiting.pk).expected_start is not None


def test_a_run_past_its_time_limit_ends_timed_out_and_its_tasks_are_stopped(alice):
    host = one_host(devices=1)
    slow = job(alice, host, "slow", limit=60)
    scheduling.schedule_cluster(host.cluster_id)
    Job.objects.filter(pk=slow.pk).update(state=JobState.RUNNING, placed_at=timezone.now() - timedelta(seconds=61))

    assert time_limits.check_time_limits() == [slow.pk]

    ended = Job.objects.get(pk=slow.pk)
    assert ended.state == JobState.TIMED_OUT and ended.reason == "time limit of 60 s reached"
    assert set(Task.objects.filter(job=ended).values_list("state", flat=True)) == {TaskState.STOPPING}
    assert time_limits.check_time_limits() == []  # once


def test_the_api_takes_a_time_limit_and_priority_and_refuses_what_the_cluster_does_not_allow(alice):
    host = one_host(devices=1)
    host.cluster.max_time_limit_s = 7200
    host.cluster.save()
    api = APIClient()
    api.force_authenticate(alice)
    base = {"name": "n", "strategy": "mirrored", "workers": 1, "devices_per_worker": 1, "builtin": "digits_mlp"}

    too_long = api.post("/api/jobs/", {**base, "time_limit_s": 7201}, format="json")
    unknown = api.post("/api/jobs/", {**base, "priority": "urgent"}, format="json")
    ok = api.post("/api/jobs/", {**base, "time_limit_s": 600, "priority": "low"}, format="json")
    default = api.post("/api/jobs/", base, format="json")

    assert too_long.status_code == 400 and "At most 7200 s" in too_long.json()["time_limit_s"][0]
    assert unknown.status_code == 400 and "Unknown priority class 'urgent'" in unknown.json()["priority"][0]
    assert ok.status_code == 201 and (ok.json()["time_limit_s"], ok.json()["priority"]) == (600, "low")
    assert default.status_code == 201, default.json()
    assert (default.json()["time_limit_s"], default.json()["priority"]) == (7200, "normal")  # the default, capped


def test_the_queue_api_lists_waiting_jobs_in_order_and_only_staff_change_it(alice, bob, django_user_model):
    host = one_host(devices=1)
    busy = job(alice, host, "running")
    scheduling.schedule_cluster(host.cluster_id)
    later = job(alice, host, "alice's secret name")
    first = job(bob, host, "bob's", priority="high")
    scheduling.schedule_cluster(host.cluster_id)
    api = APIClient()
    api.force_authenticate(bob)

    rows = api.get(f"/api/clusters/{host.cluster_id}/queue/").json()

    assert [(r["position"], r["id"], r["owner"]) for r in rows] == [(1, first.pk, "bob"), (2, later.pk, "alice")]
    assert rows[0]["name"] == "bob's" and rows[1]["name"] == "" and rows[1]["reason"] == ""  # not his
    assert rows[0]["expected_start"] is not None and rows[0]["reservation"]["hosts"] == {host.name: [0]}
    assert api.post(f"/api/jobs/{first.pk}/hold/").status_code == 403
    staff = django_user_model.objects.create_user("ops", password="x", is_staff=True)
    api.force_authenticate(staff)
    assert api.post(f"/api/jobs/{later.pk}/priority/", {"priority": "high"}, format="json").json()["priority"] == "high"
    assert api.post(f"/api/jobs/{first.pk}/hold/").json()["held"] is True
    assert api.post(f"/api/jobs/{busy.pk}/hold/").status_code == 409  # not waiting
    scheduling.schedule_cluster(host.cluster_id)
    rows = api.get(f"/api/clusters/{host.cluster_id}/queue/").json()
    assert [r["id"] for r in rows] == [first.pk, later.pk] and rows[0]["held"] and rows[1]["expected_start"]
    # The held job no longer promises a start: its reservation went to the job behind it.
    assert rows[0]["expected_start"] is None and rows[0]["reservation"] == {} and "held by staff" in rows[0]["reason"]
    # alice may not submit at high herself (issue 42): staff may lift her job there, and her job's history says so.
    assert [e.text for e in JobEvent.objects.filter(job=later)] == [
        "priority normal -> high by ops (beyond alice's own right)"
    ]


def test_two_users_quota_two_each_b_reclaims_what_a_borrowed_in_one_pass_and_a_resumes_later(alice, bob):
    host = one_host(devices=4)
    Quota.objects.create(cluster=host.cluster, user=alice, devices=2)
    Quota.objects.create(cluster=host.cluster, user=bob, devices=2)
    a_jobs = [job(alice, host, f"a{i}") for i in range(4)]
    scheduling.schedule_cluster(host.cluster_id)
    assert states(*a_jobs) == [JobState.STARTING] * 4  # the idle cluster lends A two devices beyond her quota
    assert [Job.objects.get(pk=j.pk).borrowing for j in a_jobs] == [False, False, True, True]
    running(*a_jobs)
    b_jobs = [job(bob, host, f"b{i}") for i in range(2)]

    scheduling.schedule_cluster(host.cluster_id)  # one pass preempts for both of B's jobs

    assert states(*a_jobs) == [JobState.RUNNING, JobState.RUNNING, JobState.PREEMPTED, JobState.PREEMPTED]
    for victim in a_jobs[2:]:
        tasks_gone(victim)  # the grace passes, the agent reports them gone
    scheduling.schedule_cluster(host.cluster_id)
    assert states(*b_jobs) == [JobState.STARTING] * 2
    assert states(*a_jobs[2:]) == [JobState.PREEMPTED] * 2  # waiting, their place kept
    for done in b_jobs:
        tasks_gone(done)
        Job.objects.filter(pk=done.pk).update(state=JobState.SUCCEEDED)
    scheduling.schedule_cluster(host.cluster_id)
    assert states(*a_jobs[2:]) == [JobState.STARTING] * 2  # A's resume once B is done
    assert [Job.objects.get(pk=j.pk).restarts for j in a_jobs] == [0] * 4


@pytest.mark.django_db(transaction=True)
def test_a_job_cancelled_while_a_pass_plans_it_is_not_started(alice, monkeypatch):
    """The pass reads the queue, plans, then writes its starts: a cancel that commits in between (another request, its
    own connection) wins, and the cancelled job gets no tasks; the pass starts the rest."""
    import threading

    from django.db import connection

    from orchestrator.scheduler import queueing

    queueing.standard_classes_if_none()  # a transactional test starts from a flushed database
    host = one_host(devices=2)
    doomed, kept = job(alice, host, "cancelled meanwhile"), job(alice, host, "started")
    plan = scheduling._plan_pass

    def cancel() -> None:  # as a request on a connection of its own would
        try:
            lifecycle.cancel(doomed.pk, "alice")
        finally:
            connection.close()

    def plan_then_cancel(*args):  # type: ignore[no-untyped-def]
        placed = plan(*args)
        assert {j.pk for j, _where in placed} == {doomed.pk, kept.pk}
        canceller = threading.Thread(target=cancel)
        canceller.start()
        canceller.join(timeout=30)
        return placed

    monkeypatch.setattr(scheduling, "_plan_pass", plan_then_cancel)
    assert scheduling.schedule_cluster(host.cluster_id) == [kept.pk]
    assert states(doomed, kept) == [JobState.CANCELLED, JobState.STARTING]
    assert not Task.objects.filter(job=doomed).exists()
