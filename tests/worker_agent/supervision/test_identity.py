"""Tasks under their job's own uid (--task-uids): the uid rule, the folders' owners and modes, what a task may hand
the agent to upload, and the start-up checks. Needs root, like the agent it tests (CI runs as root)."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.task_messages import TaskEventKind
from tests.support.wire import control_key_flags
from tests.worker_agent.recording import Recorder
from tests.worker_agent.supervision.test_metrics_pipe import artifacts, script_spec
from worker_agent.folders import Place, Roots
from worker_agent.supervision import Supervisor, identity, uid_pool
from worker_agent.supervision.identity import UidRange
from worker_agent.supervision.uid_pool import TaskUids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="task uids need root (CI runs as root)")

RANGE = UidRange(30200, 30299)  # the tests' uids: tests/support/task_uids.py


def owner_and_mode(path: Path) -> tuple[int, int]:
    info = path.lstat()
    return info.st_uid, stat.S_IMODE(info.st_mode)


# --- the uid rule ---------------------------------------------------------------------------------------------------
def test_a_job_gets_low_plus_its_id_modulo_the_size_and_its_tasks_share_it(tmp_path):
    uids = TaskUids(UidRange(30100, 30109), Roots.agent(tmp_path))
    home = tmp_path / "jobs" / "13"
    place = Place(tmp_path, ("jobs", "13"))

    first = uids.acquire(13, [place, place.child("worker-0-a0")])
    second = uids.acquire(13, [place, place.child("worker-1-a0")])

    assert first == second == 30103 == identity.preferred_uid(13, uids.uids)
    assert owner_and_mode(home) == (30103, 0o700)
    assert owner_and_mode(home / "worker-1-a0") == (30103, 0o700)


def job_folder(root: Path, job_id: int) -> Place:
    return Place(root, ("jobs", str(job_id)))


def test_two_running_jobs_never_share_a_uid_and_an_earlier_jobs_folder_goes_back_to_root(tmp_path):
    shared = tmp_path / "shared"
    for root in (shared, tmp_path / "agent"):
        root.mkdir()
    uids = TaskUids(UidRange(30110, 30111), Roots.agent(tmp_path / "agent", [shared]))
    jobs = tmp_path / "agent" / "jobs"
    a = uids.acquire(2, [job_folder(tmp_path / "agent", 2), job_folder(shared, 2)])
    (jobs / "2" / "ckpt").write_text("job 2's weights")
    os.chown(jobs / "2" / "ckpt", a, a)
    (shared / "jobs" / "2" / "model.keras").write_text("job 2's model")
    os.chown(shared / "jobs" / "2" / "model.keras", a, a)

    b = uids.acquire(4, [job_folder(tmp_path / "agent", 4)])  # 4 % 2 == 2 % 2, but job 2 still runs here
    assert (a, b) == (30110, 30111)
    uids.release(a)
    c = uids.acquire(6, [job_folder(tmp_path / "agent", 6)])  # job 2 is over: its uid serves job 6, not its files

    assert c == a
    assert owner_and_mode(jobs / "2")[0] == 0 and owner_and_mode(jobs / "2" / "ckpt")[0] == 0
    # Its folder on the shared folder too.
    assert (
        owner_and_mode(shared / "jobs" / "2")[0] == 0 and owner_and_mode(shared / "jobs" / "2" / "model.keras")[0] == 0
    )
    assert owner_and_mode(jobs / "6") == (c, 0o700)
    with pytest.raises(identity.Unusable, match="held by a running job"):
        uids.acquire(8, [job_folder(tmp_path / "agent", 8)])  # both uids are busy
    uids.release(b)
    uids.release(c)
    # Job 2 comes back (a restart): its folder, and what it held, become its new uid's again.
    again = uids.acquire(2, [job_folder(tmp_path / "agent", 2)])
    assert owner_and_mode(jobs / "2" / "ckpt")[0] == again


def test_a_hard_link_to_a_file_the_task_does_not_own_keeps_its_owner(tmp_path):
    folder = tmp_path / "jobs" / "3"
    folder.mkdir(parents=True)
    outside = tmp_path / "roots-file"
    outside.write_text("root's")
    os.link(outside, folder / "link")  # what a task could plant where protected_hardlinks is off

    uid_pool.own_folder(Place(tmp_path, ("jobs", "3")), 30103)

    assert owner_and_mode(folder)[0] == 30103
    assert outside.stat().st_uid == 0


# --- real tasks -----------------------------------------------------------------------------------------------------
@pytest.fixture
def isolated(sent: Recorder, open_tmp: Path) -> Iterator[Supervisor]:
    workdir = open_tmp / "agent"
    sup = Supervisor(sent, workdir, RANGE)
    identity.secure_workdir(sup.workdir)
    yield sup
    sup.kill_all("test over", timeout=10)


def test_a_task_runs_as_its_jobs_uid_at_home_in_its_folder_and_uploads_only_its_own_files(isolated, sent, caplog):
    secret = isolated.workdir / "token"
    secret.write_text("tfa_secret")
    secret.chmod(0o600)
    spec = script_spec(f"""
        home = os.environ["HOME"]
        print(os.getuid(), os.getgid(), os.getgroups(), home, os.environ["TMPDIR"], os.environ["USER"], flush=True)
        print(sys.argv[0], flush=True)
        mine = os.path.join(os.environ["TFDASH_JOB_DIR"], "model.keras")
        with open(mine, "wb") as out:
            out.write(b"weights")
        os.symlink({str(secret)!r}, os.path.join(home, "innocent.keras"))
        emit({{"kind": "artifact", "ts": 1.0, "name": "stolen.keras", "path": {str(secret)!r}}})
        emit({{"kind": "artifact", "ts": 1.0, "name": "linked.keras", "path": os.path.join(home, "innocent.keras")}})
        emit({{"kind": "artifact", "ts": 1.0, "name": "model.keras", "path": mine}})
    """)

    with caplog.at_level(logging.WARNING, logger="worker_agent.supervision.metrics_pipe"):
        isolated.launch(spec)
        exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    assert exited["exit_code"] == 0, sent.texts(spec.task_id, "stderr")
    uid = identity.preferred_uid(spec.job_id, RANGE)
    home = isolated.workdir / "jobs" / str(spec.job_id)
    tmp = "/tmp" if isolated.workspace.private else home / "tmp"
    script = home / "worker-0-a3" / f"{spec.program.script_sha256}.py"
    assert sent.texts(spec.task_id) == [f"{uid} {uid} [] {home} {tmp} tfdash-task-{uid}", str(script)]
    assert [a["name"] for a in artifacts(sent, spec.task_id)] == ["model.keras"]  # the metrics pipe crossed the switch
    assert "'stolen.keras'" in caplog.text and f"{secret} is not under" in caplog.text  # outside the job's folders
    assert "'linked.keras'" in caplog.text and "not a regular file" in caplog.text  # a link is never followed
    assert owner_and_mode(home) == (uid, 0o700)
    assert owner_and_mode(isolated.workdir) == (0, 0o711)
    assert owner_and_mode(isolated.workdir / "ledger") == (0, 0o700)
    # The script it ran lives in its own folder, its uid's alone: no shared cache another job could read.
    assert owner_and_mode(script) == (uid, 0o400)
    assert not (isolated.workdir / "scripts").exists()


# --- start-up -------------------------------------------------------------------------------------------------------
def agent(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    token = cwd / "token"
    token.write_text("tfa_whatever")
    token.chmod(0o600)
    return subprocess.run(
        [sys.executable, "-m", "worker_agent", "--server", "redis://127.0.0.1:1/0", "--host", "h-1",
         "--token-file", str(token), *control_key_flags(), *argv],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_agent_refuses_to_start_when_a_task_uid_cannot_reach_its_workdir(open_tmp):
    closed = open_tmp / "private"
    closed.mkdir(mode=0o700)

    result = agent("--task-uids", "30200-30299", "--workdir", str(closed / "agent"), cwd=open_tmp)

    assert result.returncode == 2
    assert "refusing to start: task uid 30200 cannot run tasks here" in result.stderr
    assert f"the agent's workdir {closed / 'agent'} is under {closed} (mode 700)" in result.stderr


def test_the_agent_refuses_a_range_that_holds_an_account(tmp_path):
    result = agent("--task-uids", "1-10", "--workdir", str(tmp_path / "agent"), cwd=tmp_path)

    assert result.returncode == 2
    assert "--task-uids 1-10 overlaps existing accounts" in result.stderr and "daemon" in result.stderr


def test_closed_ancestor_names_the_first_folder_others_cannot_enter(open_tmp):
    (open_tmp / "a" / "b").mkdir(parents=True)
    (open_tmp / "a").chmod(0o700)

    assert identity.closed_ancestor(open_tmp / "a" / "b" / "python") == open_tmp / "a"
    assert identity.closed_ancestor(open_tmp / "python") is None
