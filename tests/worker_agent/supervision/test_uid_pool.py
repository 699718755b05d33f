"""A task uid is free only when it is empty: what a job left running under it (a double-forked, setsid sleeper) is
killed before another job can have the uid; and only by the last agent on the machine holding it. Real processes,
as root (CI runs as root)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from tests.support.processes import gone
from worker_agent.folders import Place, Roots
from worker_agent.supervision import reaping
from worker_agent.supervision.identity import UidRange
from worker_agent.supervision.uid_pool import TaskUids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="task uids need root (CI runs as root)")

UID = 30_977  # a range of one: every job gets it; the tests' uids: tests/support/task_uids.py

# Forks, the child starts a session of its own and forks again, the grandchild sleeps; both parents are gone at once.
ESCAPE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # lets go of the caller's pipes, as a daemon does
            os.dup2(quiet, fd)
        time.sleep(300)
    os._exit(0)
os.wait()
"""


def leave_a_sleeper(uid: int) -> int:
    """Run a 'task' as `uid` that leaves a setsid grandchild behind; its pid."""
    done = subprocess.run(
        [sys.executable, "-c", ESCAPE], user=uid, group=uid, extra_groups=[], capture_output=True, text=True, timeout=30
    )
    pid = int(done.stdout.split()[0])
    assert psutil.Process(pid).uids().real == uid and os.getsid(pid) != os.getsid(0)
    return pid


def pool(root: Path) -> TaskUids:
    root.mkdir(exist_ok=True)
    return TaskUids(UidRange(UID, UID), Roots.agent(root))


def job(root: Path, job_id: int) -> list[Place]:
    return [Place(root, ("jobs", str(job_id)))]


def test_the_last_task_of_a_job_leaves_its_uid_empty_before_the_next_job_gets_it(tmp_path):
    uids = pool(tmp_path / "agent")
    uid = uids.acquire(1, job(tmp_path / "agent", 1))
    uids.acquire(1, job(tmp_path / "agent", 1))  # a second task of the same job
    sleeper = leave_a_sleeper(uid)

    uids.release(uid)  # one task of the job is over: the other still runs under the uid
    assert not gone(sleeper)
    uids.release(uid)  # the job's last one
    assert gone(sleeper)
    assert reaping.alive(uid.__eq__) == {}
    assert uids.acquire(2, job(tmp_path / "agent", 2)) == uid
    uids.release(uid)


def test_an_agent_empties_a_uid_only_when_no_other_agent_on_the_machine_holds_it(tmp_path):
    one, other = pool(tmp_path / "one"), pool(tmp_path / "other")  # two agents of a local cluster, one job on both
    uid = one.acquire(5, job(tmp_path / "one", 5))
    assert other.acquire(5, job(tmp_path / "other", 5)) == uid
    sleeper = leave_a_sleeper(uid)  # left by the job's task on the first agent

    one.release(uid)
    assert not gone(sleeper)  # the other agent's task of the job may still need its uid
    other.release(uid)
    assert gone(sleeper)


def test_at_start_up_what_an_earlier_job_left_under_a_task_uid_is_killed(tmp_path):
    sleeper = leave_a_sleeper(UID)  # as if the agent had died while the job ran

    pool(tmp_path / "agent").sweep()

    assert gone(sleeper)


def test_a_task_of_the_job_that_arrives_while_its_uid_is_emptied_waits_for_it(tmp_path, monkeypatch):
    uids = pool(tmp_path / "agent")
    uid = uids.acquire(7, job(tmp_path / "agent", 7))
    order: list[str] = []
    restart = threading.Thread(target=lambda: order.append(f"got {uids.acquire(7, job(tmp_path / 'agent', 7))}"))
    real_empty = reaping.empty

    def empty(uid: int, timeout: float = reaping.EMPTY_TIMEOUT_S) -> list[int]:
        # The job's next task (a restart) asks for its uid while the kill runs: it must not get it before the end.
        if not order:
            order.append("emptying")
            restart.start()
            restart.join(0.5)  # had it not waited, it would be done by now
            order.append("emptied")
        return real_empty(uid, timeout)

    monkeypatch.setattr(reaping, "empty", empty)
    uids.release(uid)
    restart.join(10)

    assert order == ["emptying", "emptied", f"got {uid}"]
    uids.release(uid)
