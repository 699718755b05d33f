"""What the agent-distribution tests share: a virtualenv with only `pip install ./agent` in it, a live web server the
agent joins, and a way to submit a job and wait for its end."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from orchestrator.models import Job
from tests.browser.conftest import WebServer
from tests.conftest import AGENT_HEARTBEAT_S
from tests.support.ports import free_port
from tests.support.processes import ROOT, wait_until
from tests.support.task_uids import TASK_UIDS

AGENT_PROJECT = ROOT / "agent"
# Beside the checkout (var/ is ignored), not under pytest's 0700 tmp: as root the agent's tasks run under uids of
# their own, and they must be able to run this venv's interpreter.
VENV_CACHE = ROOT / "var" / "test-agent-venvs"
PIP_TIMEOUT_S = 900


def _pip(python: Path, *args: str) -> None:
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, (
        f"pip install {' '.join(args)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    )


def installed(python: Path) -> dict[str, str]:
    """What `pip list` says the venv holds: {lower-case name: version}."""
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return {name.lower(): version for name, _, version in (line.partition("==") for line in listed.split())}


@pytest.fixture(scope="session")
def agent_venv() -> Path:
    """A virtualenv made from the test interpreter's base Python with `pip install ./agent` alone; returns its folder.

    Its dependencies are installed once per content of agent/pyproject.toml (the venv is kept under VENV_CACHE, keyed
    by that hash and the Python version: a clean clone builds it, in CI too); the agent itself is reinstalled from the
    tree at every session, so the code tested is the code checked out."""
    key = hashlib.sha256((AGENT_PROJECT / "pyproject.toml").read_bytes() + sys.version.encode()).hexdigest()[:16]
    venv = VENV_CACHE / key
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():  # never built, or a build that was cut short: from scratch
        VENV_CACHE.mkdir(parents=True, exist_ok=True)
        VENV_CACHE.chmod(0o755)
        shutil.rmtree(venv, ignore_errors=True)
        base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=300)
        _pip(python, str(AGENT_PROJECT))
        (venv / ".complete").touch()
    else:
        _pip(python, "--no-deps", "--force-reinstall", str(AGENT_PROJECT))
    # Folders task uids must enter to run its interpreter.
    for folder in (VENV_CACHE, venv):
        folder.chmod(0o755)
    return venv


@pytest.fixture
def join_server(service_env: dict[str, str], transactional_db: None, artifacts_dir: Path) -> Iterator[WebServer]:
    """The control plane's web server (Daphne, as shipped) that agents join, telling them the suite's heartbeat
    interval and, as root, its task uid range."""
    env = {
        **service_env,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "TFDASH_AGENT_HEARTBEAT_S": str(AGENT_HEARTBEAT_S),
        "TFDASH_AGENT_TASK_UIDS": TASK_UIDS,
    }
    server = WebServer(env, free_port())
    server.start()
    yield server
    server.stop()
    (artifacts_dir / "web-agent-join.log").write_text("\n".join(server.logs))


def agent_env() -> dict[str, str]:
    """A host's environment: nothing of the control plane's (no Django settings, database, broker password or key)."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME")
    return {**{k: v for k, v in os.environ.items() if k in keep}, "PYTHONUNBUFFERED": "1"}


def submit_script(alice: object, name: str, source: str, **fields: object) -> int:
    api = APIClient()
    api.force_authenticate(alice)
    data = {"name": name, "script": SimpleUploadedFile(name, source.encode()), **fields}
    response = api.post("/api/jobs/", data, format="multipart")
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def wait_for_end(job_id: int, timeout: float = 180) -> Job:
    final = ("succeeded", "failed", "cancelled", "timed_out")
    return wait_until(
        lambda: (job := Job.objects.get(pk=job_id)).state in final and job,
        timeout,
        interval=0.25,
        what=f"job {job_id} to end",
    )


def log_of(job: Job) -> str:
    return "\n".join(
        text for task in job.current_tasks() for text in task.log_lines.order_by("seq").values_list("text", flat=True)
    )
