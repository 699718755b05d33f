"""Task environments through the whole product, with real agents, Celery, PostgreSQL and TensorFlow: environments
registered per cluster reach the agents (a signed order on their hello), each host probes each interpreter and
reports it, a job runs in the environment it names, a job naming one no host has is refused, a requirements file is
built into a venv once and reused, and a host whose NVML GPUs its environment's TensorFlow cannot use is flagged and
gets no task of it (NVML simulated: this machine has no GPU).

The second environment is TensorFlow 2.15's (var/envs/tf215, which scripts/task_envs.sh builds; or the interpreter
TFDASH_TEST_SECOND_ENV names): each job's facts then carry its own environment's version, and the two differ. Where
it was not built, a venv made in the test stands in (`python -m venv` and a .pth into the product venv's
site-packages): the same TensorFlow, so the test then proves each job ran in its own environment's interpreter (its
sys.prefix) and carries the version its hosts probed for that environment, not that the versions differ.
"""

from __future__ import annotations

import html
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from orchestrator.environments import orders
from orchestrator.models import Cluster, Host, HostStatus, Job, TaskEnvironment
from tests import factories
from tests.orchestrator.test_jobs_e2e import log_text, wait_for_job
from tests.support.processes import ROOT, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

FAKE_NVML = Path(__file__).resolve().parent / "fake_nvml"
MAIN = str(Path(sys.executable).absolute())  # the product's venv, as `make run` registers it
TF215 = Path(os.environ.get("TFDASH_TASK_ENVS_DIR") or ROOT / "var" / "envs") / "tf215"
SCRIPT = b"""
import sys
import tensorflow as tf
print(f"ran in {sys.prefix} with TensorFlow {tf.__version__}", flush=True)
"""
REQUIREMENTS_SCRIPT = b"""
import tabulate
print("tabulate from", tabulate.__file__, flush=True)
"""


def second_environment(folder: Path) -> str:
    """An interpreter of its own with the product venv's TensorFlow: a venv whose site-packages names the product
    venv's (no copy, no download), or the one TFDASH_TEST_SECOND_ENV names."""
    given = os.environ.get("TFDASH_TEST_SECOND_ENV")
    if given:
        return given
    if (TF215 / "bin" / "python").is_file() and (TF215 / ".tfdash-env").is_file():
        return str(TF215 / "bin" / "python")
    venv = folder / "second-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    base = subprocess.run([sys.executable, "-c", "import site; print(*site.getsitepackages(), sep='\\n')"],
                          check=True, capture_output=True, text=True).stdout  # fmt: skip
    (site / "_product_venv.pth").write_text(base)
    return str(venv / "bin" / "python")


def reported(host: str, name: str) -> dict | None:
    envs = Host.objects.get(name=host).environments
    return next((e for e in envs if e.get("name") == name), None)


def wait_reported(hosts: list[str], name: str, timeout: float = 180) -> list[dict]:
    return wait_until(
        lambda: (found := [reported(h, name) for h in hosts]) and all(found) and found,
        timeout,
        interval=0.5,
        what=f"{hosts} to report environment {name}",
    )


@pytest.fixture
def environments_cluster(orchestrator, start_agent, open_tmp):  # type: ignore[no-untyped-def]
    """Cluster `envs` with environments `main` (the product venv, its default) and `second`, and two hosts with
    real agents, which learn the environments on their hello."""
    cluster = Cluster.objects.create(name="envs", shared_dir=str(open_tmp / "shared"))
    second = second_environment(open_tmp)
    TaskEnvironment.objects.create(cluster=cluster, name="main", interpreter=MAIN, is_default=True)
    TaskEnvironment.objects.create(cluster=cluster, name="second", interpreter=second, labels="tf-same-as-main")
    names = []
    for i in range(2):
        host, token = factories.host(f"envs-{i}", cluster_name="envs", port_min=29100 + 20 * i)
        Host.objects.filter(pk=host.pk).update(port_max=29100 + 20 * i + 19, cpu_slots=2)
        start_agent(host.name, token)
        names.append(host.name)
    wait_until(lambda: Host.objects.filter(cluster=cluster, status=HostStatus.ONLINE).count() == 2, 60,
               what="2 hosts online")  # fmt: skip
    cluster.second_interpreter = second  # type: ignore[attr-defined]
    cluster.host_names = names  # type: ignore[attr-defined]
    return cluster


def submit_script(api, cluster: Cluster, name: str, script: bytes, **fields: str):  # type: ignore[no-untyped-def]
    from django.core.files.uploadedfile import SimpleUploadedFile

    data = {"name": name, "cluster": cluster.pk, "strategy": "mirrored", "workers": 1, "devices_per_worker": 1,
            "script": SimpleUploadedFile(f"{name}.py", script), **fields}  # fmt: skip
    return api.post("/api/jobs/", data, format="multipart")


def test_a_job_runs_in_the_environment_it_names_and_reports_its_tensorflow(api, environments_cluster):
    cluster = environments_cluster
    hosts = cluster.host_names
    for name in ("main", "second"):
        found = wait_reported(hosts, name)
        assert all(e["ok"] and e["tensorflow"] for e in found), found
    versions = {name: reported(hosts[0], name)["tensorflow"] for name in ("main", "second")}
    print(f"\nprobed TensorFlow: {versions}")

    jobs = {}
    for name in ("main", "second"):
        response = api.post(
            "/api/jobs/",
            {"name": f"digits in {name}", "cluster": cluster.pk, "strategy": "mirrored", "workers": 1,
             "devices_per_worker": 1, "builtin": "synthetic", "builtin_config": {"epochs": 1}, "environment": name,
             "legacy_keras": False},
            format="json",
        )  # fmt: skip
        assert response.status_code == 201, response.content
        assert response.json()["environment"] == name
        script = submit_script(api, cluster, f"where-{name}", SCRIPT, environment=name)
        assert script.status_code == 201, script.content
        jobs[name] = (response.json()["id"], script.json()["id"])
    # A job that names none gets the cluster's default.
    default = submit_script(api, cluster, "where-default", SCRIPT)
    assert default.status_code == 201 and default.json()["environment"] == "main", default.content

    for name, (builtin_id, script_id) in jobs.items():
        job = wait_for_job(builtin_id, timeout=300)
        assert job.state == "succeeded", (job.reason, [log_text(t)[-2000:] for t in job.current_tasks()])
        facts = wait_until(lambda jid=builtin_id: Job.objects.get(pk=jid).facts.get("tf_version"), 30,
                           what="the job's facts")  # fmt: skip
        assert facts == versions[name], (name, facts, versions)
        job = wait_for_job(script_id, timeout=300)
        assert job.state == "succeeded", (job.reason, [log_text(t)[-2000:] for t in job.current_tasks()])
        prefix = str(Path(MAIN if name == "main" else cluster.second_interpreter).parent.parent)
        task = job.current_tasks()[0]
        line = wait_until(lambda t=task: next((x for x in log_text(t).splitlines() if "ran in" in x), None), 30,
                          what="the script's line")  # fmt: skip
        assert line == f"ran in {prefix} with TensorFlow {versions[name]}", line
    if "second-env" not in cluster.second_interpreter:  # another TensorFlow, not the stand-in
        assert versions["main"] != versions["second"], versions
    print(f"jobs ran in their environments: {jobs}")


def test_a_job_naming_an_environment_no_host_has_is_refused(api, environments_cluster):
    cluster = environments_cluster
    missing = submit_script(api, cluster, "missing", SCRIPT, environment="nope")
    assert missing.status_code == 400
    assert "has no environment named nope" in str(missing.json()["environment"]), missing.json()
    assert "main, second" in str(missing.json()["environment"])

    # Registered, but no host can run it: refused with each host's reason.
    TaskEnvironment.objects.create(cluster=cluster, name="broken", interpreter="/nonexistent/bin/python")
    orders.tell(list(Host.objects.filter(cluster=cluster)))
    wait_reported(cluster.host_names, "broken")
    broken = submit_script(api, cluster, "broken", SCRIPT, environment="broken")
    assert broken.status_code == 400
    said = str(broken.json()["environment"])
    assert "No host of cluster envs can run environment broken" in said and "does not exist on this host" in said

    # A requirements file with a pip option is refused at the boundary, saying which line.
    option = submit_script(api, cluster, "opt", SCRIPT, requirements="tabulate\n--index-url http://example.invalid/")
    assert option.status_code == 400 and "Line 2: pip options" in str(option.json()["requirements"]), option.json()


def test_a_requirements_file_is_built_once_and_reused(api, environments_cluster):
    cluster = environments_cluster
    wait_reported(cluster.host_names, "main")
    timings = []
    for n in range(2):
        began = time.monotonic()
        # One host (its own label-free shape on a 2-slot host): the second job meets the first one's venv there.
        response = submit_script(api, cluster, f"needs-tabulate-{n}", REQUIREMENTS_SCRIPT,
                                 requirements="tabulate  # a small package from the index\n",
                                 startup_deadline_s="900", labels="")  # fmt: skip
        assert response.status_code == 201, response.content
        job = wait_for_job(response.json()["id"], timeout=900)
        timings.append(time.monotonic() - began)
        task = job.current_tasks()[0]
        text = wait_until(lambda t=task: "tabulate from" in (x := log_text(t)) and x, 30, what="its output")
        assert job.state == "succeeded", (job.reason, text[-3000:])
        assert "/envs/" in text.split("tabulate from", 1)[1].splitlines()[0], text
        print(f"\njob {n} on {task.host.name}: {timings[-1]:.1f} s submit-to-end; its first lines: "
              f"{text.splitlines()[:2]}")  # fmt: skip
        if n == 0:
            built_on = task.host.name
            assert "building the requirements venv" in text, text[:2000]
    # The second run used the venv the first built wherever it landed on the same host; on the other host it built
    # its own (once per host): either way nothing was built twice on one host.
    second_text = log_text(job.current_tasks()[0])
    if job.current_tasks()[0].host.name == built_on:
        assert "ready (built before): reused" in second_text, second_text[:2000]
    print(f"requirements venv: first job {timings[0]:.1f} s, second job {timings[1]:.1f} s (build then reuse)")


def test_a_host_whose_environment_cannot_use_its_gpus_is_flagged_and_gets_no_task_of_it(
    api, orchestrator, start_agent, open_tmp, monkeypatch
):
    cluster = Cluster.objects.create(name="gpus", shared_dir=str(open_tmp / "shared"))
    TaskEnvironment.objects.create(cluster=cluster, name="main", interpreter=MAIN, is_default=True)
    cpu, cpu_token = factories.host("gpus-cpu", cluster_name="gpus", port_min=29200)
    gpu, gpu_token = factories.host("gpus-sim", cluster_name="gpus", port_min=29300)
    Host.objects.filter(pk=cpu.pk).update(cpu_slots=2)
    start_agent(cpu.name, cpu_token)
    with monkeypatch.context() as patched:  # this agent alone finds the simulated NVML first on its path
        patched.setenv("PYTHONPATH", str(FAKE_NVML))
        start_agent(gpu.name, gpu_token)
    wait_until(lambda: len(Host.objects.get(pk=gpu.pk).gpus) == 2, 60, what="the simulated GPUs reported")
    on_gpu_host = wait_reported([gpu.name], "main")[0]
    assert on_gpu_host["ok"] and on_gpu_host["gpus_visible"] == 0
    assert on_gpu_host["gpu_reason"], on_gpu_host  # NVML shows 2 GPUs, TensorFlow none: flagged, with the reason
    assert not wait_reported([cpu.name], "main")[0]["gpu_reason"]  # no GPU there: nothing to flag

    # The host's page says so.
    staff = get_user_model().objects.create_user("staff", password="pw-staff-123", is_staff=True, is_superuser=True)
    browser = Client()
    browser.force_login(staff)
    page = html.unescape(browser.get(f"/admin/orchestrator/host/{gpu.pk}/change/").content.decode())
    assert "its TensorFlow cannot use the host's GPUs" in page, page

    # Its jobs go to the CPU host only: a GPU task there would train on the CPU with the GPUs booked.
    job_ids = []
    for n in range(2):
        response = submit_script(api, cluster, f"anywhere-{n}", SCRIPT)
        assert response.status_code == 201, response.content
        job_ids.append(response.json()["id"])
    for job_id in job_ids:
        job = wait_for_job(job_id, timeout=300)
        assert job.state == "succeeded", job.reason
        assert {t.host.name for t in job.current_tasks()} == {cpu.name}

    # With the CPU host gone from the cluster, a job of that environment is refused, saying why.
    Host.objects.filter(pk=cpu.pk).delete()
    refused = submit_script(api, cluster, "nowhere", SCRIPT)
    assert refused.status_code == 400
    assert "cannot use the host's GPUs" in str(refused.json()["environment"]), refused.json()


def test_a_requirements_file_that_does_not_build_fails_the_job_with_pips_last_lines(api, environments_cluster):
    cluster = environments_cluster
    wait_reported(cluster.host_names, "main")
    response = submit_script(api, cluster, "cannot-build", REQUIREMENTS_SCRIPT,
                             requirements="no-such-package-tfdash-test==1.0\n", startup_deadline_s="900")  # fmt: skip
    assert response.status_code == 201, response.content
    job = wait_for_job(response.json()["id"], timeout=900)
    assert job.state == "failed"
    said = f"{job.reason} {[t.detail for t in job.current_tasks()]}"
    assert "building the job's requirements venv failed" in said and "no-such-package-tfdash-test" in said, said
