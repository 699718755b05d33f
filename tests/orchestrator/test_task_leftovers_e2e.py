"""What a job leaves on a host is gone before the next job comes (issue 20): a process that escaped its task's
process group, and whatever it wrote in /tmp or /dev/shm.

Real orchestrator, a real agent as root with --task-uids (as in CI), real jobs of plain Python scripts.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.models import Host, HostStatus, Job, Task
from tests import factories
from tests.orchestrator.test_jobs_e2e import log_text, submit, wait_for_job
from tests.support.processes import ManagedProcess, gone, wait_until
from worker_agent.supervision import reaping
from worker_agent.supervision.private_tmp import PrivateTmp

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="task uids and a private /tmp need the agent to run as root (CI does)"
    ),
]

ONE_WORKER = {"strategy": "mirrored", "workers": 1, "devices_per_worker": 1}
ONE_UID = "30800-30800"  # every job on the host gets the same uid, one after another
HOST_WORK = Path("/tmp/my_working_dir")
PRIVATE = "tasks get their own /tmp, /dev/shm and /proc"


def online(start_agent: Any, name: str, port: int, *extra: str) -> tuple[Host, ManagedProcess]:
    host, token = factories.host(name, port_min=port)
    Host.objects.filter(pk=host.pk).update(port_max=port + 9, cpu_slots=2)
    agent = start_agent(host.name, token, *extra)
    wait_until(lambda: Host.objects.get(pk=host.pk).status == HostStatus.ONLINE, 30, what="the host online")
    return host, agent


def succeeded(job_id: int) -> Job:
    job = wait_for_job(job_id)
    assert job.state == "succeeded", (job.reason, [log_text(t)[-2000:] for t in job.current_tasks()])
    return job


def line(task: Task, prefix: str) -> str:
    """The rest of the task's first log line that starts with `prefix` (lines travel through the ingest: waited for)."""
    return wait_until(
        lambda: next((t[len(prefix) :] for t in log_text(task).splitlines() if t.startswith(prefix)), None),
        30,
        what=f"a {prefix!r} line in the task's log",
    )


# --- a process that escaped its task ---------------------------------------------------------------------------------
def test_a_setsid_sleeper_is_killed_when_its_job_ends_and_the_next_job_with_its_uid_finds_nothing(
    api, orchestrator, start_agent
):
    _, agent = online(start_agent, "left-0", 29800, "--task-uids", ONE_UID)
    uid = int(ONE_UID.split("-", maxsplit=1)[0])

    first = succeeded(submit(api, "escapes.py", **ONE_WORKER, args="leave"))
    sleeper = int(line(first.current_tasks()[0], "SLEEPER "))

    # By the time the job is over, its uid is empty: the sleeper (its own session, not in the task's group) is gone.
    assert gone(sleeper)
    assert reaping.alive(uid.__eq__) == {}
    assert "killing them" in agent.output()  # the agent found it and said so

    second = succeeded(submit(api, "escapes.py", **ONE_WORKER, args="look"))
    seen = json.loads(line(second.current_tasks()[0], "SEEN "))
    assert seen == {"uid": uid, "processes": []}  # the same uid, and nothing of the first job's under it


# --- /tmp and /dev/shm ------------------------------------------------------------------------------------------------
@pytest.fixture
def host_marker() -> Iterator[Path]:
    """A file in the host's /tmp: no task may see it."""
    fd, name = tempfile.mkstemp(prefix="tfdash-host-marker-", dir="/tmp")
    os.close(fd)
    os.chmod(name, 0o644)
    shutil.rmtree(HOST_WORK, ignore_errors=True)  # whatever an earlier run without a private /tmp left
    yield Path(name)
    os.unlink(name)


def tmp_report(job: Job) -> dict[str, Any]:
    return json.loads(line(job.current_tasks()[0], "TMP "))


def test_the_same_script_writing_a_fixed_tmp_path_runs_as_jobs_after_and_beside_each_other(
    api, orchestrator, start_agent, open_tmp, host_marker
):
    _, agent = online(start_agent, "tmp-0", 29810)
    assert PRIVATE in agent.output()
    workdir = open_tmp / "agent-tmp-0"
    gate = open_tmp / "gate"  # under the agent's shared root: tasks see it
    args = f"{gate} {host_marker}"

    # Two at once on one host (two device slots): each in /tmp/my_working_dir while the other is.
    together = [submit(api, "fixed_tmp_path.py", **ONE_WORKER, args=args) for _ in range(2)]
    wait_until(
        lambda: all("READY" in log_text(t) for j in together for t in Job.objects.get(pk=j).current_tasks()),
        120,
        what="both jobs' tasks in their /tmp at once",
    )
    gate.touch()
    # Then one after another.
    after = []
    for _ in range(2):
        after.append(submit(api, "fixed_tmp_path.py", **ONE_WORKER, args=args))
        succeeded(after[-1])

    for job_id in (*together, *after):
        report = tmp_report(succeeded(job_id))
        assert report["work"] == [f"job-{job_id}.txt"] and report["segment"] == str(job_id)  # its own files only
        assert report["marker_seen"] is False and report["tmpdir"] == "/tmp"
        assert report["proc_uids"] == [report["uid"]]  # its own /proc: no other uid's process
        # Nothing of it is left on the host: not in its /tmp, nor its private /tmp and /dev/shm folders.
        assert not (workdir / "jobs" / str(job_id) / "tmp").exists()
    assert not HOST_WORK.exists()
    assert list(PrivateTmp(workdir, []).shm_root.path.iterdir()) == []  # the agent's folder in the host's /dev/shm
