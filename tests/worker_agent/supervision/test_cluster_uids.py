"""On an agent, a job's uid is the one its launch order's slot names (the control plane's pool per cluster:
orchestrator/scheduler/task_uids.py), the same on every host, so two live jobs of a cluster never share a uid whichever
hosts run them, and one job's tasks on several hosts share one (issue 42). As root (CI runs as root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker_agent.folders import Place, Roots
from worker_agent.supervision.identity import UidRange, Unusable
from worker_agent.supervision.uid_pool import TaskUids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="task uids need root (CI runs as root)")

UIDS = UidRange(30_600, 30_601)  # two uids, on both hosts (the tests' uids: tests/support/task_uids.py)


def host(root: Path) -> TaskUids:
    root.mkdir(exist_ok=True)
    return TaskUids(UIDS, Roots.agent(root))


def folder(root: Path, job_id: int) -> list[Place]:
    return [Place(root, ("jobs", str(job_id)))]


def test_two_live_jobs_on_two_hosts_get_the_uids_their_slots_name_not_one_each_host_picks(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    one, two = host(a), host(b)
    # Jobs 1 and 3: each host alone would give both the same uid (the same place in a range of two).
    first = one.acquire(1, folder(a, 1), slot=0)
    second = two.acquire(3, folder(b, 3), slot=1)

    assert (first, second) == (UIDS.low, UIDS.low + 1)
    one.release(first)
    two.release(second)


def test_one_jobs_tasks_on_two_hosts_share_its_uid(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    one, two = host(a), host(b)
    # Job 4's folder on host b is owned by the other uid (an earlier job's): the slot wins, the folder is the job's.
    (b / "jobs" / "4").mkdir(parents=True)
    os.chown(b / "jobs" / "4", UIDS.low, UIDS.low)

    uids = {one.acquire(4, folder(a, 4), slot=1), two.acquire(4, folder(b, 4), slot=1)}

    assert uids == {UIDS.low + 1}
    assert (b / "jobs" / "4").stat().st_uid == UIDS.low + 1
    one.release(UIDS.low + 1)
    two.release(UIDS.low + 1)


def test_a_slot_the_host_cannot_give_is_refused_with_the_reason(tmp_path):
    a = tmp_path / "a"
    one = host(a)
    with pytest.raises(Unusable, match=r"slot 2 lies outside this host's --task-uids 30600-30601"):
        one.acquire(5, folder(a, 5), slot=2)

    held = one.acquire(6, folder(a, 6), slot=0)
    # The control plane took job 6's tasks for ended (its host lost, say), but they still run here.
    with pytest.raises(Unusable, match=r"uid 30600 \(slot 0\) still serves job 6 on this host"):
        one.acquire(7, folder(a, 7), slot=0)
    one.release(held)


def test_an_order_without_a_slot_still_gets_a_uid_older_control_planes_keep_working(tmp_path):
    a = tmp_path / "a"
    one = host(a)
    uid = one.acquire(8, folder(a, 8))
    assert uid in UIDS
    one.release(uid)
