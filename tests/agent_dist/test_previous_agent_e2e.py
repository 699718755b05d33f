"""One protocol behind: the agent of the last protocol-3 commit (PREVIOUS), its code taken from git and run as it was,
against this control plane. Its hello is accepted and its host recorded as protocol 3; orders to it are signed in
protocol 3 without the launch-spec keys it does not know; a job runs on it to the end, with its log lines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.broker import without_credentials
from orchestrator.identity.keys import control_public_key
from orchestrator.models import Host, HostStatus
from tests import factories
from tests.agent_dist.conftest import log_of, submit_script, wait_for_end
from tests.conftest import AGENT_HEARTBEAT_S
from tests.support.processes import ROOT, ManagedProcess, wait_until
from tests.support.task_uids import TASK_UIDS

pytestmark = pytest.mark.django_db(transaction=True)

# The last commit whose wire is protocol 3 (contracts/signing.py WIRE_VERSION = 3).
PREVIOUS = "e6cafe8"
PACKAGES = ("worker_agent", "contracts", "kombu_redis", "celery_steps")


@pytest.fixture
def previous_agent_code() -> Iterator[Path]:
    """The agent's packages as they were at PREVIOUS, in a folder task uids can read (their runtime runs from it)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the previous agent's code comes from this repository's history")
    known = subprocess.run(["git", "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], cwd=ROOT, capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} is not in this clone (a shallow clone?): fetch its history to run this test")
    folder = Path(tempfile.mkdtemp(prefix="tfdash-agent-v3-"))
    folder.chmod(0o755)
    archive = subprocess.run(["git", "archive", PREVIOUS, *PACKAGES], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    for path in folder.rglob("*"):  # as root, tasks run under uids of their own and import its runtime from here
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_an_agent_one_protocol_behind_runs_a_job(
    previous_agent_code, orchestrator, redis_url, open_tmp, alice, artifacts_dir
):
    signing = (previous_agent_code / "contracts" / "signing.py").read_text()
    assert "WIRE_VERSION = 3" in signing  # the code under test really is the previous protocol's
    cluster = factories.cluster()
    cluster.shared_dir = str(open_tmp / "shared")
    cluster.save()
    (open_tmp / "shared").mkdir()
    host, token = factories.host("v3-1", port_min=27500)
    token_file = open_tmp / "token"
    token_file.touch(mode=0o600)
    token_file.write_text(token)
    workdir = open_tmp / "agent-v3-1"
    workdir.mkdir()
    # Its packages first on the path, and run from its folder (not this checkout, which `python -m` would put first).
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "TFDASH_CONTROL_KEY_FILE")},
        "PYTHONPATH": str(previous_agent_code),
        "TFDASH_SERVER": without_credentials(redis_url),
        "PYTHONUNBUFFERED": "1",
    }
    uids = ["--task-uids", TASK_UIDS] if TASK_UIDS else []
    argv = [
        sys.executable, "-m", "worker_agent", "--host", host.name, "--token-file", str(token_file), *uids,
        "--control-key", control_public_key(), "--shared-root", str(open_tmp / "shared"),
        "--heartbeat-interval", str(AGENT_HEARTBEAT_S), "--workdir", str(workdir),
    ]  # fmt: skip
    agent = ManagedProcess("agent-v3-1", argv, env, previous_agent_code)
    try:
        online = wait_until(
            lambda: (h := Host.objects.get(pk=host.pk)).status == HostStatus.ONLINE and h,
            60,
            what=f"v3-1 online; agent said:\n{agent.output()[-3000:]}",
        )
        assert online.agent_protocol == 3
        assert online.agent_refusal == ""

        job_id = submit_script(alice, "hello.py", 'print("hello from a protocol 3 agent", flush=True)\n')
        job = wait_for_end(job_id)

        assert job.state == "succeeded", (job.reason, log_of(job)[-2000:], agent.output()[-3000:])
        wait_until(lambda: "hello from a protocol 3 agent" in log_of(job), 30, what="the script's line")
        # Every order reached it as one it could read: it refused none.
        assert "refused" not in agent.output().lower(), agent.output()[-3000:]
    finally:
        if agent.proc.poll() is None:
            agent.terminate(timeout=20)  # the agent then kills its tasks
        agent.stop()
        (artifacts_dir / "agent-v3-1.log").write_text(agent.output())
