"""The control plane's pool of task uid slots per cluster (orchestrator/scheduler/task_uids.py), through real scheduler
passes on PostgreSQL: two live jobs of a cluster never get one slot, one job's launch orders to its hosts all name
the same, and a slot goes to another job only once no task of its holder is active (issue 42). The agents' side (a
slot is the same uid on every host): tests/worker_agent/supervision/test_cluster_uids.py."""

from __future__ import annotations

import pytest

from contracts.task_messages import launch_spec_from
from orchestrator.jobs import dispatch
from orchestrator.models import Host, Job, JobState, TaskState
from orchestrator.scheduler import scheduling
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def hosts(n: int, cluster: str = "lab", first_port: int = 26000) -> list[Host]:
    made = []
    for i in range(n):
        host, _token = factories.host(cluster_name=cluster, port_min=first_port + 100 * i)
        host.cpu_slots, host.status = 2, "online"
        host.save()
        made.append(host)
    return made


def job(owner, cluster: str = "lab", *, workers: int = 1, devices: int = 1) -> Job:  # type: ignore[no-untyped-def]
    return Job.objects.create(
        owner=owner, cluster=factories.cluster(cluster), name="j", strategy="multi_worker_mirrored",
        program_kind="builtin", builtin="digits_mlp", workers=workers, devices_per_worker=devices,
    )  # fmt: skip


def placed(*jobs: Job) -> list[Job]:
    scheduling.schedule_cluster(jobs[0].cluster_id)
    for each in jobs:
        each.refresh_from_db()
        assert each.state == JobState.STARTING, each.reason
    return list(jobs)


def order_slots(the_job: Job) -> dict[str, int | None]:
    """Host name -> the uid slot its launch order for the job names, as the agent reads the order."""
    return {
        task.host.name: launch_spec_from(dispatch.launch_body(dispatch.launch_spec(task, {}))).uid_slot
        for task in the_job.current_tasks().select_related("job", "job__cluster", "job__script")
    }


def end(the_job: Job) -> None:
    the_job.tasks.update(state=TaskState.SUCCEEDED)
    Job.objects.filter(pk=the_job.pk).update(state=JobState.SUCCEEDED)


def test_two_live_jobs_never_share_a_slot_and_one_jobs_orders_to_two_hosts_name_the_same(alice):
    hosts(3)
    wide = job(alice, workers=2, devices=2)  # a whole host per worker: two hosts
    narrow = job(alice)
    placed(wide, narrow)

    wide_orders, narrow_orders = order_slots(wide), order_slots(narrow)
    assert len(wide_orders) == 2 and len(set(wide_orders.values())) == 1  # one uid on both of its hosts
    assert set(wide_orders.values()) == {wide.task_uid_slot}
    assert set(narrow_orders.values()) == {narrow.task_uid_slot}
    assert wide.task_uid_slot != narrow.task_uid_slot
    assert {wide.task_uid_slot, narrow.task_uid_slot} == {0, 1}  # lowest first: slots stay below the live jobs


def test_a_slot_goes_to_another_job_only_once_its_holders_tasks_have_all_ended(alice):
    hosts(2)
    first, second = placed(job(alice), job(alice))
    third = job(alice)
    placed(third)
    assert third.task_uid_slot not in (first.task_uid_slot, second.task_uid_slot)  # both still run

    first.tasks.filter(index=0).update(state=TaskState.STOPPING)  # being stopped: still holds its slot
    Job.objects.filter(pk=third.pk).update(state=JobState.SUCCEEDED)
    third.tasks.update(state=TaskState.SUCCEEDED)
    fourth = placed(job(alice))[0]
    assert fourth.task_uid_slot == third.task_uid_slot  # the lowest free: the ended job's, not the stopping one's
    third.refresh_from_db()
    assert third.task_uid_slot is None  # taken from it

    end(first)
    fifth = placed(job(alice))[0]
    assert fifth.task_uid_slot == first.task_uid_slot


def test_a_restarted_job_keeps_its_slot_while_it_waits_and_each_cluster_has_its_own_pool(alice):
    hosts(1)
    hosts(1, cluster="other", first_port=27000)
    mine = placed(job(alice))[0]
    theirs = placed(job(alice, "other"))[0]
    assert (mine.task_uid_slot, theirs.task_uid_slot) == (0, 0)  # separate clusters share no folder

    # A gang restart: its tasks have ended, and it waits (held by staff) while another job is placed. Not finished, it
    # keeps its slot (the uid its folders belong to): the other job gets the next one.
    mine.tasks.update(state=TaskState.FAILED)
    Job.objects.filter(pk=mine.pk).update(state=JobState.RESTARTING, restarts=1, max_restarts=1, held=True)
    other = placed(job(alice))[0]
    assert other.task_uid_slot == 1
    # Placed again, with the slot it had.
    Job.objects.filter(pk=mine.pk).update(held=False)
    again = placed(mine)[0]
    assert again.task_uid_slot == 0 and again.attempt == 2
    assert set(order_slots(again).values()) == {0}
