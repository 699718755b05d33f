"""The `tfdash` command as a user on a laptop has it: installed into a fresh venv with only the client's pinned
dependencies (no Django, no TensorFlow), against a running stack (Daphne, the orchestrator and ingest, two real
agents): login, a MultiWorkerMirrored script that reads its data file's path from a job variable submitted with
--wait, its logs followed, a failing script, `ls --json`, and the refusals a shell script tests by exit code."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from orchestrator.models import Host, HostStatus, Job, MetricPoint, TaskLogLine
from tests import factories
from tests.orchestrator.metrics.test_tensorboard_export import read_back
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent.parent
PROGRAMS = ROOT / "tests" / "programs"
PASSWORD = "pw-alice-123"  # tests/conftest.py's alice


@pytest.fixture(scope="module")
def tfdash_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the client distribution and exactly client/requirements.txt, nothing cached from a run
    before: what `pip install ./client` gives a laptop."""
    venv = tmp_path_factory.mktemp("laptop") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-cache-dir", "--no-deps"]
    subprocess.run(
        [*pip, "-r", str(ROOT / "client" / "requirements.txt"), str(ROOT / "client")],
        check=True,
        timeout=300,
        capture_output=True,
    )
    python = str(venv / "bin" / "python")
    for server_side in ("django", "tensorflow", "orchestrator", "contracts"):
        probe = subprocess.run([python, "-c", f"import {server_side}"], capture_output=True, cwd="/", check=False)
        assert probe.returncode != 0, f"{server_side} is importable in the client's venv"
    return venv / "bin" / "tfdash"


@pytest.fixture
def laptop(tmp_path: Path, tfdash_bin: Path) -> Iterator[Laptop]:
    yield Laptop(tfdash_bin, tmp_path / "home")


class Laptop:
    """Runs `tfdash` with a home of its own and none of the test's environment (no Django settings, no URLs)."""

    def __init__(self, binary: Path, home: Path) -> None:
        home.mkdir()
        self.binary = binary
        self.home = home
        self.env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "COLUMNS": "200"}

    def run(self, *args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.home,
            timeout=timeout,
            check=False,
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.binary), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=self.home,
        )

    @property
    def config_file(self) -> Path:
        return self.home / ".config" / "tfdash" / "config.json"


def test_cli_answers_with_exit_codes_a_shell_script_can_test(web, alice, laptop):
    assert laptop.run("ls").returncode == 3  # not logged in
    wrong = laptop.run("login", web.url, "-u", "alice", "--password-stdin", stdin="nope\n")
    assert wrong.returncode == 3 and "refused" in wrong.stderr
    assert not laptop.config_file.exists()

    login = laptop.run("login", web.url, "-u", "alice", "--password-stdin", stdin=PASSWORD + "\n")

    assert login.returncode == 0, login.stderr
    assert stat.S_IMODE(laptop.config_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(laptop.config_file.parent.stat().st_mode) == 0o700
    assert json.loads(laptop.run("ls", "--json").stdout) == []
    assert laptop.run("status", "999999").returncode == 4
    assert laptop.run("artifacts", "999999", "--download").returncode == 4
    assert laptop.run("tensorboard", "999999").returncode == 4
    assert json.loads(laptop.run("experiment", "show", "--json").stdout) == []
    assert laptop.run("status", "abc").returncode == 2
    reserved = laptop.run("submit", str(PROGRAMS / "exits_3.py"), "--env", "LD_PRELOAD=/tmp/x.so")
    assert (
        reserved.returncode == 2 and "LD_PRELOAD is reserved" in reserved.stderr and "Traceback" not in reserved.stderr
    )
    too_many = laptop.run("submit", str(PROGRAMS / "exits_3.py"), "--workers", "1000")
    assert too_many.returncode == 2 and "workers must be at most 256" in too_many.stderr
    missing = laptop.run("submit", str(laptop.home / "nope.py"))
    assert missing.returncode != 0 and "Cannot read" in missing.stderr and "Traceback" not in missing.stderr
    # The server's own refusal, on the option to change: no cluster can ever run 64 devices per worker here.
    factories.host("only", port_min=27500)
    refused = laptop.run("submit", str(PROGRAMS / "exits_3.py"), "--strategy", "mirrored", "--devices-per-worker", "64")
    assert refused.returncode == 5 and "can never run" in refused.stderr
    queue = laptop.run("queue", "--json")
    queues = json.loads(queue.stdout)
    assert queue.returncode == 0 and queues and all(rows == [] for rows in queues.values())  # nothing waits
    assert not Job.objects.exists()


def test_cli_runs_a_multi_worker_job_on_a_data_file_named_by_a_job_variable(
    web, alice, laptop, orchestrator, start_agent, open_tmp
):
    for i in range(2):
        host, token = factories.host(f"cli-{i}", port_min=27600 + 10 * i)
        Host.objects.filter(pk=host.pk).update(port_max=27600 + 10 * i + 9, cpu_slots=1)
        start_agent(host.name, token)
    wait_until(lambda: Host.objects.filter(status=HostStatus.ONLINE).count() == 2, timeout=30, what="2 hosts online")
    digits = load_digits()
    data = open_tmp / "digits.npz"
    np.savez(data, x_train=(digits.data / 16).astype("float32"), y_train=digits.target)
    data.chmod(0o644)  # tasks run under their job's own uid
    assert laptop.run("login", web.url, "-u", "alice", "--password-stdin", stdin=PASSWORD + "\n").returncode == 0

    script = str(PROGRAMS / "mwms_env_data.py")
    waiting = laptop.start(
        "submit", script, "--strategy", "multi_worker_mirrored", "--workers", "2", "--env", f"DATA={data}",
        "--epochs", "2", "--wait", "--poll", "0.3", "--", "--epochs", "2",
    )  # fmt: skip
    assert waiting.stderr is not None
    first = waiting.stderr.readline()
    job_id = int(re.match(r"job (\d+) submitted", first).group(1))  # type: ignore[union-attr]
    followed = laptop.run("logs", str(job_id), "--task", "worker:0", "-f", "--poll", "0.3", timeout=240)
    out, err = waiting.communicate(timeout=240)

    job = Job.objects.get(pk=job_id)
    assert waiting.returncode == 0, (first + err, out, job.reason)
    assert job.state == "succeeded" and job.env == {"DATA": str(data)}
    assert "succeeded" in out and f"DATA={data}" in out  # the final status names the variable
    assert "epoch" in err or "running" in err  # progress while it ran
    assert followed.returncode == 0, followed.stderr
    printed = followed.stdout.splitlines()
    assert any(line.startswith("runtime ok: tensorboard 2.21.0, tf_keras 2.21.0") for line in printed), printed
    assert f"DATA={data}: 1797 examples, 64 features" in printed
    # Followed by cursor: every line once, in order, as stored.
    worker0 = job.current_tasks().get(type="worker", index=0)
    stored = list(TaskLogLine.objects.filter(task=worker0).order_by("seq").values_list("text", flat=True))
    assert printed == stored[: len(printed)]

    # The job's stored metrics as a TensorBoard logdir, read back by TensorBoard's own reader: the stored points.
    exported = laptop.run("tensorboard", str(job_id), "--to", "tb")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.strip() == f"tensorboard --logdir tb/job{job_id}"
    logdir = laptop.home / "tb" / f"job{job_id}"
    for task in job.current_tasks():
        stored = list(
            MetricPoint.objects.filter(task=task, phase="epoch_end", name="loss")
            .order_by("step")
            .values_list("step", "ts", "value")
        )
        assert stored, f"{task} reported no epoch loss"
        assert read_back(logdir / f"{task.type}-{task.index}" / "epoch_end")["loss"] == stored
    (logdir / "notes.txt").write_text("mine")
    clash = laptop.run("tensorboard", str(job_id), "--to", "tb")
    assert clash.returncode == 2 and "notes.txt" in clash.stderr and (logdir / "notes.txt").exists()
    (logdir / "notes.txt").unlink()
    again = laptop.run("tensorboard", str(job_id), "--to", "tb", "--json")  # an earlier export is replaced
    assert again.returncode == 0 and json.loads(again.stdout) == {"logdir": f"tb/job{job_id}"}

    failing = laptop.run("submit", str(PROGRAMS / "exits_3.py"), "--strategy", "mirrored", "--wait", timeout=120)

    assert failing.returncode == 1, (failing.stdout, failing.stderr)
    assert "failed" in failing.stdout and "exit 3" in failing.stdout
    listed = json.loads(laptop.run("ls", "--json").stdout)
    assert {(j["id"], j["state"]) for j in listed} >= {(job_id, "succeeded")}
    assert sorted(j["state"] for j in listed) == ["failed", "succeeded"]
