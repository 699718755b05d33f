"""The task launcher (mount_ns.py, root until it drops to the job's uid) starts from a fixed environment, and the
task's own reaches only the task: its format on the launcher's stdin is parsed strictly and bounded, the task gets
every variable exactly, and a process started as root never sees one of the job's (ld.so's LD_DEBUG_OUTPUT files,
made by each process that starts with it, are all the job's uid's). The end-to-end case with a planted gconv module:
tests/security/test_task_environment.py."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.task_messages import LaunchSpec, TaskEventKind
from tests.worker_agent.recording import Recorder
from tests.worker_agent.supervision.specs import script_spec
from worker_agent.supervision import Supervisor, identity, mount_ns
from worker_agent.supervision.identity import UidRange

RANGE = UidRange(30300, 30399)  # the tests' uids: tests/support/task_uids.py
SCRIPT = b"import json, os\nprint('ENV ' + json.dumps({'uid': os.getuid(), 'env': dict(os.environ)}), flush=True)\n"


# --- the format -----------------------------------------------------------------------------------------------------
def test_the_environment_travels_exactly_as_bytes():
    env = {"A": "x=y=z", "EMPTY": "", "SPACES": "  two  ", "UNICODE": "caf\u00e9 \u2603", "RAW": "\udcff"}

    decoded = mount_ns.decode_env(mount_ns.encode_env(env))

    assert decoded == {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    assert mount_ns.decode_env(b"") == {}


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"A=1", "does not end with NUL"),
        (b"A=1\0NOVALUE\0", "is not a NAME=value"),
        (b"=1\0", "is not a NAME=value"),
        (b"A=1\0A=2\0", "sets a name twice"),
        (b"\0", "is not a NAME=value"),
        (b"A=" + b"x" * mount_ns.ENV_MAX_BYTES + b"\0", f"over {mount_ns.ENV_MAX_BYTES} bytes"),
    ],
)
def test_the_launcher_refuses_a_malformed_or_oversized_environment(data, says):
    with pytest.raises(ValueError, match=says):
        mount_ns.decode_env(data)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"A=B": "1"}, "no environment variable"),
        ({"": "1"}, "no environment variable"),
        ({"A": "x\0y"}, "no environment variable"),
        ({"A": "x" * mount_ns.ENV_MAX_BYTES}, "over the launcher's"),
    ],
)
def test_the_agent_refuses_to_write_what_the_launcher_would_refuse(env, says):
    with pytest.raises(ValueError, match=says):
        mount_ns.encode_env(env)


def test_reading_stops_past_the_bound(tmp_path):
    path = tmp_path / "env"
    path.write_bytes(b"A=" + b"x" * (2 * mount_ns.ENV_MAX_BYTES) + b"\0")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="over"):
            mount_ns.read_env(fd)
        assert os.lseek(fd, 0, os.SEEK_CUR) < 2 * mount_ns.ENV_MAX_BYTES  # it never read the rest
    finally:
        os.close(fd)


# --- a real launch, as root -----------------------------------------------------------------------------------------
@pytest.fixture
def isolated(sent: Recorder, open_tmp: Path) -> Iterator[Supervisor]:
    if os.geteuid() != 0:
        pytest.skip("the launcher runs only when the agent is root (CI is)")
    sup = Supervisor(sent, open_tmp / "agent", RANGE, shared_roots=[open_tmp])
    identity.secure_workdir(sup.workdir)
    assert sup.workspace.private, sup.workspace.private_tmp and sup.workspace.private_tmp.why_not
    yield sup
    sup.kill_all("test over", timeout=10)


def spec(job_id: int, task_id: int, user_env: dict[str, str]) -> LaunchSpec:
    return script_spec(SCRIPT, job_id=job_id, task_id=task_id, user_env=user_env)


def test_the_task_gets_its_jobs_variables_and_no_root_process_does(isolated, sent, open_tmp):
    debug = open_tmp / "debug"
    debug.mkdir(mode=0o1777)
    debug.chmod(0o1777)  # written by each process that starts with LD_DEBUG_OUTPUT: the task, as the job's uid
    user_env = {
        "LD_DEBUG": "files",
        "LD_DEBUG_OUTPUT": str(debug / "out"),
        "GLIBC_TUNABLES": "glibc.malloc.perturb=0",
        "DATA": "a=b c",
    }
    task = spec(301, 9301, user_env)

    isolated.launch(task)

    exited = sent.wait_for(task.task_id, TaskEventKind.EXITED, timeout=60)
    assert exited["exit_code"] == 0, sent.texts(task.task_id, "stderr")
    [line] = [text for text in sent.texts(task.task_id) if text.startswith("ENV ")]
    seen = json.loads(line.removeprefix("ENV "))
    assert {name: seen["env"].get(name) for name in user_env} == user_env
    assert seen["env"]["TFDASH_JOB_ID"] == "301"  # tfdash's own still set on top
    assert seen["uid"] in RANGE
    owners = {path.name: path.stat().st_uid for path in debug.iterdir()}
    assert owners, "ld.so wrote nothing: LD_DEBUG_OUTPUT never reached the task"
    assert set(owners.values()) == {seen["uid"]}  # never root's: the launcher never had it
