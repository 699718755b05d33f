"""The agent as an admin installs it: a fresh virtualenv with only `pip install ./agent` (no Django, no TensorFlow)
joins a live control plane with the command the admin's page shows, runs from the configuration it wrote, and runs
jobs: a script that needs no TensorFlow in the agent's own interpreter, and a built-in TensorFlow program in the
cluster's task environment `main` (the product's venv, as `make run` registers it), whose TensorFlow the installed
agent probed."""

from __future__ import annotations

import json
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from contracts.signing import WIRE_VERSION
from orchestrator.identity import tokens
from orchestrator.identity.broker_users import agent_server_url
from orchestrator.identity.keys import control_public_key
from orchestrator.models import Host, HostStatus, Job, TaskEnvironment
from tests import factories
from tests.agent_dist.conftest import agent_env, installed, log_of, submit_script, wait_for_end
from tests.support.processes import ManagedProcess, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = """
import importlib.util, sys
print("ran in", sys.executable, "django:", importlib.util.find_spec("django") is not None, flush=True)
"""


def test_a_fresh_venv_with_only_the_agent_joins_and_runs_a_job(
    agent_venv, join_server, orchestrator, open_tmp, alice, artifacts_dir
):
    packages = installed(agent_venv / "bin" / "python")
    assert "tfdash-agent" in packages
    assert not {"django", "tensorflow", "tensorflow-cpu", "channels", "daphne", "tfdash"} & set(packages)

    cluster = factories.cluster()
    cluster.shared_dir = str(open_tmp / "shared")
    cluster.save()
    (open_tmp / "shared").mkdir()
    # Not the default: a job that names none runs in the agent's own interpreter.
    TaskEnvironment.objects.create(cluster=cluster, name="main", interpreter=str(Path(sys.executable).absolute()))
    host, token = factories.host("dist-1", port_min=27400)
    token_file = open_tmp / "token"
    token_file.touch(mode=0o600)
    token_file.write_text(token + "\n")
    config = open_tmp / "etc" / "config.json"
    workdir = open_tmp / "agent-dist-1"

    # The join line the admin's page shows for this host, with this test's file and folders.
    join = shlex.split(tokens.agent_commands(host, join_server.url, token_file=str(token_file))["join"])
    assert join[:2] == ["tfdash-agent", "join"]
    argv = [str(agent_venv / "bin" / "tfdash-agent"), *join[1:], "--config", str(config), "--workdir", str(workdir)]
    joined = subprocess.run(argv, cwd=open_tmp, env=agent_env(), capture_output=True, text=True, timeout=120)

    assert joined.returncode == 0, joined.stderr
    assert f"joined {join_server.url} as dist-1" in joined.stdout
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    written = json.loads(config.read_text())
    assert token not in config.read_text()  # the token stays in its own file
    assert written["server"] == agent_server_url() and written["control_key"] == control_public_key()
    assert (written["port_range"], written["shared_roots"]) == ("27400-27499", [str(open_tmp / "shared")])
    assert written["token_file"] == str(token_file)
    # Once: a second join does not overwrite it.
    again = subprocess.run(argv, cwd=open_tmp, env=agent_env(), capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "exists already" in again.stderr

    agent = ManagedProcess(
        "agent-dist-1",
        [str(agent_venv / "bin" / "tfdash-agent"), "run", "--config", str(config)],
        agent_env(),
        open_tmp,
    )
    try:
        online = wait_until(
            lambda: (h := Host.objects.get(pk=host.pk)).status == HostStatus.ONLINE and h,
            60,
            what=f"dist-1 online; agent said:\n{agent.output()[-3000:]}",
        )
        assert online.agent_version == packages["tfdash-agent"]
        assert online.agent_protocol == WIRE_VERSION

        job_id = submit_script(alice, "hello.py", SCRIPT)
        job = wait_for_end(job_id)

        assert job.state == "succeeded", (job.reason, log_of(job)[-2000:], agent.output()[-3000:])
        line = wait_until(lambda: "ran in" in (text := log_of(job)) and text, 30, what="the script's line")
        assert f"ran in {agent_venv}/bin/python" in line  # the installed agent's interpreter ran it
        assert "django: False" in line

        # TensorFlow from the environment the job names: the agent without TensorFlow probed it and runs it there.
        main = wait_until(
            lambda: next((e for e in Host.objects.get(pk=host.pk).environments if e["name"] == "main"), None),
            180,
            what="dist-1 to report environment main",
        )
        assert main["ok"] and main["tensorflow"], main
        api = APIClient()
        api.force_authenticate(alice)
        response = api.post(
            "/api/jobs/",
            {"name": "digits in main", "strategy": "mirrored", "workers": 1, "devices_per_worker": 1,
             "builtin": "synthetic", "builtin_config": {"epochs": 1}, "environment": "main"},
            format="json",
        )  # fmt: skip
        assert response.status_code == 201, response.content
        job = wait_for_end(response.json()["id"], timeout=300)
        assert job.state == "succeeded", (job.reason, log_of(job)[-2000:], agent.output()[-3000:])
        tf_version = wait_until(
            lambda: Job.objects.get(pk=job.pk).facts.get("tf_version"), 30, what="the job's TensorFlow in its facts"
        )
        assert tf_version == main["tensorflow"]
    finally:
        if agent.proc.poll() is None:
            agent.terminate(timeout=20)  # the agent then kills its tasks
        agent.stop()
        (artifacts_dir / "agent-dist-1.log").write_text(agent.output())


def test_the_agents_version_is_the_products(agent_venv):
    """One version for both distributions: what an agent reports is what the control plane of that release is."""
    import tomllib

    from tests.support.processes import ROOT

    agent = tomllib.loads((ROOT / "agent" / "pyproject.toml").read_text())["project"]["version"]
    product = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert agent == product
    version = subprocess.run(
        [str(agent_venv / "bin" / "tfdash-agent"), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert version.stdout.strip() == f"tfdash-agent {agent}"


def test_make_dist_builds_the_agent_and_client_wheels(tmp_path: Path):
    """What `make dist` runs, into a folder of the test's own."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(tmp_path), "./agent", "./client"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    wheels = sorted(p.name for p in tmp_path.glob("*.whl"))
    assert [w.split("-")[0] for w in wheels] == ["tfdash_agent", "tfdash_client"]
    import zipfile

    with zipfile.ZipFile(next(tmp_path.glob("tfdash_agent-*.whl"))) as wheel:
        tops = {name.split("/")[0] for name in wheel.namelist()}
    assert {"worker_agent", "contracts", "kombu_redis", "celery_steps"} <= tops
    assert not {"orchestrator", "dashboard", "config", "tests"} & tops
