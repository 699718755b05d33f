"""A task has a /tmp (and /var/tmp, /dev/shm, and /proc) of its own when the agent is root: the same script writing a
fixed /tmp and /var/tmp path runs as two jobs at once and one after another, each sees only its own files, and nothing
of theirs is left in the host's /tmp or /var/tmp. Real supervisor, real task processes under their jobs' uids (CI runs
as root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.task_messages import LaunchSpec, TaskEventKind
from tests.support.processes import wait_until
from tests.worker_agent.recording import Recorder
from tests.worker_agent.supervision.specs import script_spec
from worker_agent.supervision import Supervisor, identity
from worker_agent.supervision.identity import UidRange

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a private /tmp needs the agent to run as root (CI does)")

RANGE = UidRange(20000, 29999)
SCRIPT = (Path(__file__).resolve().parents[2] / "programs" / "fixed_tmp_path.py").read_bytes()
HOST_WORK = Path("/tmp/my_working_dir")
HOST_VAR_WORK = Path("/var/tmp/my_working_dir")  # outlives a reboot: what a job leaves there meets every later one


@pytest.fixture
def isolated(sent: Recorder, open_tmp: Path) -> Iterator[Supervisor]:
    shared = open_tmp / "shared"
    shared.mkdir()
    sup = Supervisor(sent, open_tmp / "agent", RANGE, shared_roots=[shared])
    identity.secure_workdir(sup.workdir)
    tmp = sup.workspace.private_tmp
    assert tmp is not None and tmp.available, tmp and tmp.why_not  # root here: CI can make mount namespaces
    for path in (HOST_WORK, HOST_VAR_WORK):
        shutil.rmtree(path, ignore_errors=True)  # whatever an earlier run without private /tmp left
    yield sup
    sup.kill_all("test over", timeout=10)


@pytest.fixture
def host_marker() -> Iterator[Path]:
    """A file in the host's /tmp: a task must not see it."""
    fd, name = tempfile.mkstemp(prefix="tfdash-host-marker-", dir="/tmp")
    os.close(fd)
    os.chmod(name, 0o644)
    yield Path(name)
    os.unlink(name)


def spec(job_id: int, task_id: int, *args: str) -> LaunchSpec:
    return script_spec(SCRIPT, *args, job_id=job_id, task_id=task_id)


def reported(sent: Recorder, task_id: int) -> dict[str, Any]:
    exited = sent.wait_for(task_id, TaskEventKind.EXITED, timeout=60)
    assert exited["exit_code"] == 0, sent.texts(task_id, "stderr")
    [line] = [text for text in sent.texts(task_id) if text.startswith("TMP ")]
    return json.loads(line.removeprefix("TMP "))


def assert_private(isolated: Supervisor, report: dict[str, Any], job_id: int) -> None:
    uid = identity.preferred_uid(job_id, RANGE)
    assert report["uid"] == uid
    assert report["work"] == report["var_work"] == [f"job-{job_id}.txt"]  # its own file only
    assert report["stdin"] == "/dev/null"  # the launcher read the task's environment there: nothing of it is left
    assert report["segment"] == str(job_id)  # its own /dev/shm
    assert report["marker_seen"] is False and report["tmpdir"] == "/tmp"
    tmp = isolated.workspace.private_tmp
    assert tmp is not None
    if tmp.proc:  # its own /proc: no other uid's process, other jobs' command lines included
        assert report["proc_uids"] == [uid]


def assert_nothing_left(isolated: Supervisor, job_ids: list[int]) -> None:
    tmp = isolated.workspace.private_tmp
    assert tmp is not None
    assert not HOST_WORK.exists() and not HOST_VAR_WORK.exists()
    for job_id in job_ids:
        assert not (isolated.workdir / "jobs" / str(job_id) / "tmp").exists()
        assert not (isolated.workdir / "jobs" / str(job_id) / "var-tmp").exists()
        assert not tmp.shm_root.child(f"job-{job_id}").path.exists()


def test_two_jobs_at_once_each_get_their_own_tmp_and_leave_nothing_in_the_hosts(isolated, sent, open_tmp, host_marker):
    gate = open_tmp / "shared" / "gate"
    first, second = spec(101, 9101, str(gate), str(host_marker)), spec(102, 9102, str(gate), str(host_marker))

    isolated.launch(first)
    isolated.launch(second)
    wait_until(
        lambda: all("READY" in sent.texts(s.task_id) for s in (first, second)), 60, what="both tasks in /tmp at once"
    )
    gate.touch()

    assert_private(isolated, reported(sent, first.task_id), 101)
    assert_private(isolated, reported(sent, second.task_id), 102)
    assert_nothing_left(isolated, [101, 102])


def test_the_same_script_runs_as_one_job_after_another(isolated, sent, open_tmp, host_marker):
    gate = open_tmp / "shared" / "gate"
    gate.touch()

    for job_id in (103, 104):
        task = spec(job_id, 9000 + job_id, str(gate), str(host_marker))
        isolated.launch(task)
        assert_private(isolated, reported(sent, task.task_id), job_id)
    assert_nothing_left(isolated, [103, 104])
    isolated.kill_all("the agent stops")
    assert not isolated.workspace.private_tmp.shm_root.path.exists()  # its folder in the host's /dev/shm too


def test_a_task_environment_under_tmp_is_still_there_for_the_task(isolated, sent, open_tmp):
    """A task environment installed under /tmp (a checkout there, as a CI clone may be) is bound back into the task's
    own /tmp, like the agent's folders: without it, the launcher could not find the interpreter ("No such file")."""
    env = open_tmp / "envs" / "under-tmp"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    for folder in (open_tmp / "envs", *env.rglob("*")):
        if folder.is_dir():
            folder.chmod(0o755)
    interpreter = env / "bin" / "python"
    task = script_spec(
        b"import sys\nprint('PREFIX', sys.prefix, flush=True)\n",
        job_id=105,
        task_id=9105,
        environment="under-tmp",
        interpreter=str(interpreter),
    )

    isolated.launch(task)

    exited = sent.wait_for(task.task_id, TaskEventKind.EXITED, timeout=60)
    assert exited["exit_code"] == 0, sent.texts(task.task_id, "stderr")
    assert f"PREFIX {env}" in sent.texts(task.task_id)
    assert_nothing_left(isolated, [105])
