"""A task uid goes to the next job only once what the last job left outside its processes and folders is gone: SysV
shared memory, semaphores and message queues, POSIX message queues, and files in /var/tmp and /dev/shm (issue 42).
Real kernel objects made by a real process running as the uid; as root (CI runs as root)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from worker_agent.folders import Place, Roots
from worker_agent.supervision import leftovers
from worker_agent.supervision.identity import UidRange
from worker_agent.supervision.uid_pool import TaskUids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="task uids need root (CI runs as root)")

UID = 30_975  # a range of one: every job gets it; the tests' uids: tests/support/task_uids.py
KEY = 0x7F_D4_20_42  # the SysV key the first job uses; the next job looks it up by the same key
QUEUE = "/tfdash-test-leftover"

# Run as the uid: `leave` makes one of each kind and exits; `look` says which of them it can still open.
TASK = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
key, queue, files = int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4:]
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
IPC_CREAT = 0o1000
if sys.argv[1] == "leave":
    assert libc.shmget(key, 4096, IPC_CREAT | 0o600) >= 0, "shmget"
    assert libc.semget(key, 1, IPC_CREAT | 0o600) >= 0, "semget"
    assert libc.msgget(key, IPC_CREAT | 0o600) >= 0, "msgget"
    assert libc.mq_open(queue, os.O_CREAT | os.O_RDWR, 0o600, None) >= 0, "mq_open"
    for name in files:
        os.makedirs(os.path.dirname(name), exist_ok=True)
        with open(name, "w") as file:
            file.write("the first job's data")
else:
    print(json.dumps({
        "shm": libc.shmget(key, 0, 0) >= 0,
        "sem": libc.semget(key, 0, 0) >= 0,
        "msg": libc.msgget(key, 0) >= 0,
        "mqueue": libc.mq_open(queue, os.O_RDONLY, 0, None) >= 0,
        "files": [name for name in files if os.path.exists(name)],
    }))
"""


@pytest.fixture
def files(tmp_path):
    """Where the first job writes: /var/tmp (a file, and a file in a folder of its own), /dev/shm, and a folder of
    another owner in /var/tmp that every user may write to (the uid's file in it goes, the folder stays)."""
    shared = Path("/var/tmp") / f"tfdash-test-open-{os.getpid()}"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    names = [
        f"/var/tmp/tfdash-test-{os.getpid()}.txt",
        f"/var/tmp/tfdash-test-dir-{os.getpid()}/data.txt",
        f"/dev/shm/tfdash-test-{os.getpid()}",
        f"{shared}/data.txt",
    ]
    yield names
    leftovers.clear(UID)  # whatever a failed test left
    shutil.rmtree(shared)


def run_as(uid: int, what: str, files: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-I", "-c", TASK, what, str(KEY), QUEUE, *files],
        user=uid, group=uid, extra_groups=[], env={}, cwd="/", capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if what == "look" else {}


def pool(root: Path) -> TaskUids:
    root.mkdir(exist_ok=True)
    return TaskUids(UidRange(UID, UID), Roots.agent(root))


NOTHING = {"shm": False, "sem": False, "msg": False, "mqueue": False, "files": []}


def test_the_next_job_given_the_uid_finds_nothing_of_what_the_last_one_left(tmp_path, files):
    uids = pool(tmp_path / "agent")
    uid = uids.acquire(1, [Place(tmp_path / "agent", ("jobs", "1"))])
    run_as(uid, "leave", files)
    assert run_as(uid, "look", files) == {"shm": True, "sem": True, "msg": True, "mqueue": True, "files": files}

    uids.release(uid)  # the job's last task here is over
    assert uids.acquire(2, [Place(tmp_path / "agent", ("jobs", "2"))]) == uid

    assert run_as(uid, "look", files) == NOTHING
    assert Path(files[3]).parent.is_dir()  # another owner's folder stays, only the uid's file in it went
    uids.release(uid)


def test_what_a_uid_left_while_no_agent_held_it_is_gone_before_a_job_gets_it(tmp_path, files):
    run_as(UID, "leave", files)  # as if the agent had died while the job ran, or the kill had come late

    uids = pool(tmp_path / "agent")
    assert uids.acquire(3, [Place(tmp_path / "agent", ("jobs", "3"))]) == UID

    assert run_as(UID, "look", files) == NOTHING
    assert leftovers.left_by(UID) == []
    uids.release(UID)


def test_at_start_up_what_an_earlier_agents_jobs_left_is_removed(tmp_path, files):
    run_as(UID, "leave", files)  # the agent died while the job ran: no job will take the uid soon, maybe

    pool(tmp_path / "agent").sweep()

    assert leftovers.left_by(UID) == []
    assert run_as(UID, "look", files) == NOTHING


def test_an_agent_leaves_a_uid_held_by_another_agent_of_the_machine_alone(tmp_path, files):
    one, other = pool(tmp_path / "one"), pool(tmp_path / "other")  # one job's tasks on two agents of a local cluster
    uid = one.acquire(5, [Place(tmp_path / "one", ("jobs", "5"))])
    run_as(uid, "leave", files)  # the job's task on the first agent, still running

    assert other.acquire(5, [Place(tmp_path / "other", ("jobs", "5"))]) == uid
    other.release(uid)
    assert run_as(uid, "look", files)["shm"] is True  # not the second agent's to remove: the job still runs

    one.release(uid)  # the last one out
    assert run_as(uid, "look", files) == NOTHING


def test_where_the_host_mounts_the_mqueue_filesystem_the_uids_queues_are_removed_there(tmp_path):
    """Hosts with systemd or Docker mount it at /dev/mqueue (this one may not): the same walk on a mount of our own."""
    libc = ctypes.CDLL(None, use_errno=True)
    mount = tmp_path / "mqueue"
    mount.mkdir()
    if libc.mount(b"mqueue", str(mount).encode(), b"mqueue", 0, None) != 0:
        pytest.skip(f"cannot mount the mqueue filesystem here: {os.strerror(ctypes.get_errno())}")
    try:
        run_as(UID, "leave", [])
        assert leftovers.mqueue_mounted(mount)
        assert (mount / QUEUE.lstrip("/")).stat().st_uid == UID

        found = leftovers.Found()
        leftovers.remove_queues(mount, UID, found)

        assert found.removed == [f"message queue {QUEUE}"] and not found.left
        assert run_as(UID, "look", [])["mqueue"] is False
    finally:
        leftovers.clear(UID)
        libc.umount2(str(mount).encode(), 0)
