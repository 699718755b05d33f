"""Verdicts of real cluster runs (real agents, TensorFlow on loopback) that no existing end-to-end test had.

TensorFlow's own ParameterServer tutorial (tests/programs/ps_tutorial.py), run as a user's script: it saves under
/tmp/my_working_dir, which each task has on its own host, so the ps's variable shards cannot be gathered; the verdict
names the path and says to use $TFDASH_JOB_DIR. With that one line changed (tests/programs/ps_tutorial_job_dir.py)
the same job succeeds. A two-worker MultiWorkerMirrored job whose worker 1 raises: worker 1 is the cause, whatever
worker 0's gRPC error says or when it came."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from orchestrator.models import Job
from tests.orchestrator.diagnosis.corpus import FAILING
from tests.orchestrator.test_jobs_e2e import log_text, submit, wait_for_job
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

SHAPE = {"strategy": "parameter_server", "workers": 1, "ps": 1, "max_restarts": 0}


def test_the_tutorial_saving_under_tmp_is_told_to_use_the_job_dir_and_the_one_line_fix_succeeds(
    api, cluster_sharing_a_folder
):
    cluster_sharing_a_folder(2, "pst", 29100)
    job_id = submit(api, "ps_tutorial.py", **SHAPE)

    job = wait_for_job(job_id, timeout=240)

    chief = job.current_tasks().get(type="chief")
    assert job.state == "failed", (job.reason, log_text(chief)[-3000:])
    verdict = wait_until(
        lambda: (d := Job.objects.get(pk=job_id).diagnosis) and d["peers"] is not None and d,
        timeout=30,
        what="the verdict",
    )
    said = (verdict, log_text(chief)[-4000:])
    assert (verdict["kind"], verdict["task"], verdict["task_id"]) == ("non_shared_path", chief.label, chief.pk), said
    # Which save meets the missing folder first (the checkpoint's variables, a backup) varies from run to run.
    assert verdict["message"].startswith(f"{chief.label} "), said
    assert "/tmp/my_working_dir/" in verdict["message"] and "ps_tutorial.py:" in verdict["message"], said
    assert "$TFDASH_JOB_DIR" in verdict["hint"]
    assert any("/tmp/my_working_dir/" in line for line in verdict["evidence"]), verdict["evidence"]

    fixed = wait_for_job(submit(api, "ps_tutorial_job_dir.py", **SHAPE), timeout=240)

    assert fixed.state == "succeeded", (fixed.reason, log_text(fixed.current_tasks().get(type="chief"))[-3000:])
    assert fixed.diagnosis == {}


def test_worker_1_failing_first_in_a_two_worker_job_is_the_cause_and_worker_0_its_peer(api, cluster_sharing_a_folder):
    cluster_sharing_a_folder(2, "mw1", 29200)
    script = (FAILING / "mwms_worker1_raises.py").read_bytes()
    response = api.post(
        "/api/jobs/",
        {"name": "worker 1 raises", "strategy": "multi_worker_mirrored", "workers": 2, "max_restarts": 0,
         "script": SimpleUploadedFile("mwms_worker1_raises.py", script)},
        format="multipart",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]

    job = wait_for_job(job_id, timeout=180)

    assert job.state == "failed", job.reason
    cause = job.current_tasks().get(index=1)
    # The verdict is made again as worker 0 ends after the job (stopped, or failed by itself on its lost peer).
    wait_until(lambda: not job.current_tasks().filter(state__in=("running", "stopping")).exists(), 60, what="ends")
    verdict = wait_until(
        lambda: (d := Job.objects.get(pk=job_id).diagnosis) and d.get("lines_in") == _lines_in(job_id) and d,
        timeout=30,
        what="the verdict over every line",
    )
    said = (verdict, log_text(cause)[-3000:])
    assert (verdict["kind"], verdict["task"], verdict["task_id"]) == ("user_exception", cause.label, cause.pk), said
    assert verdict["message"].startswith(
        f"{cause.label} raised ValueError at mwms_worker1_raises.py:20: corrupt record"
    )
    assert {peer["kind"] for peer in verdict["peers"]} <= {"peer_failure", "stopped"}, verdict["peers"]
    assert all(peer["task"].startswith("worker 0 on ") for peer in verdict["peers"]), verdict["peers"]


def _lines_in(job_id: int) -> int:
    job = Job.objects.get(pk=job_id)
    return sum(job.current_tasks().values_list("log_lines_in", flat=True))
