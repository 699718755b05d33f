"""Faults with real processes killed for real: a MultiWorkerMirrored worker killed mid-run resumes from its
checkpoint, a ParameterServer worker killed is relaunched while training goes on, and a program that stops making
progress is ended with the reason."""

from __future__ import annotations

import contextlib

import psutil
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from orchestrator.models import Host, HostStatus, Job, MetricPoint, Task
from tests.orchestrator.test_jobs_e2e import log_text, wait_for_job
from tests.support.processes import gone, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def hosts(cluster_sharing_a_folder):
    return cluster_sharing_a_folder(2, "ft", 28500)


def builtin_job(api: APIClient, strategy: str, config: dict, **shape) -> int:
    response = api.post(
        "/api/jobs/",
        {"name": f"faults {strategy}", "strategy": strategy, "builtin": "digits_mlp", "builtin_config": config,
         "max_restarts": 1, **shape},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    return response.json()["id"]


def epochs_done(task: Task) -> list[int]:
    return sorted(MetricPoint.objects.filter(task=task, phase="epoch_end", name="loss").values_list("epoch", flat=True))


def kill(pid: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).kill()


def test_a_killed_multi_worker_mirrored_worker_restarts_the_job_from_its_checkpoint(api, hosts):
    config = {"epochs": 8, "per_replica_batch": 32, "steps_per_epoch": 30}
    job_id = builtin_job(api, "multi_worker_mirrored", config, workers=2, devices_per_worker=1)
    first = wait_for_job(job_id, ("running",), timeout=90)
    chief = Task.objects.get(job=first, attempt=1, type="worker", index=0)
    wait_until(lambda: len(epochs_done(chief)) >= 3, timeout=120, what="3 epochs done (checkpointed)")
    victim = Task.objects.get(job=first, attempt=1, type="worker", index=1)

    kill(victim.pid)

    job = wait_for_job(job_id, timeout=240)
    attempts = {t.attempt: t for t in Task.objects.filter(job=job, type="worker", index=0)}
    assert job.state == "succeeded", (job.reason, [log_text(t)[-2000:] for t in attempts.values()])
    assert (job.restarts, job.attempt) == (1, 2)
    assert job.restart_reason.startswith(f"worker 1 on {victim.host.name} was killed by signal 9")
    before, after = epochs_done(attempts[1]), epochs_done(attempts[2])
    resumed = attempts[2].facts["resumed_from_epoch"]
    # The second attempt ran only the epochs the checkpoint did not hold: it resumed, it did not start over.
    assert resumed >= 3 and resumed <= max(before)
    assert after == list(range(resumed + 1, 9))


def test_a_killed_parameter_server_worker_is_relaunched_and_training_goes_on(api, hosts):
    config = {"epochs": 6, "per_replica_batch": 32, "steps_per_epoch": 40}
    job_id = builtin_job(api, "parameter_server", config, workers=2, ps=1, devices_per_worker=1)
    wait_for_job(job_id, ("running",), timeout=90)
    chief = Task.objects.get(job_id=job_id, type="chief")
    wait_until(lambda: len(epochs_done(chief)) >= 1, timeout=120, what="an epoch done")
    victim = Task.objects.get(job_id=job_id, type="worker", index=1, restart=0)

    kill(victim.pid)

    job = wait_for_job(job_id, timeout=240)
    assert job.state == "succeeded", (job.reason, log_text(chief)[-3000:])
    assert (job.restarts, job.attempt) == (1, 1)  # the chief was never restarted
    again = Task.objects.get(job=job, type="worker", index=1, restart=1)
    assert again.started_at is not None and (again.host_id, again.port) == (victim.host_id, victim.port)
    assert epochs_done(chief) == list(range(1, 7))


def test_a_program_that_stops_making_progress_is_ended_with_the_reason(api, hosts, tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text("import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(3600)\n")
    response = api.post(
        "/api/jobs/",
        {"name": "sleeper", "strategy": "mirrored", "script": SimpleUploadedFile("sleeps.py", script.read_bytes()),
         "progress_timeout_s": 5},
        format="multipart",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    assert Job.objects.get(pk=job_id).progress_timeout_s == 5
    running = wait_for_job(job_id, ("running",), timeout=60)

    job = wait_for_job(job_id, timeout=30)

    assert (job.state, job.reason) == ("failed", "no progress for 5 s (no metric point or log line)")
    assert (job.finished_at - running.started_at).total_seconds() < 15
    task = Task.objects.get(job=job)
    verdict = wait_until(lambda: Job.objects.get(pk=job_id).diagnosis, timeout=10, what="the verdict")
    assert (verdict["kind"], verdict["task"], verdict["task_id"]) == ("hang", task.label, task.pk), verdict
    assert verdict["message"].endswith("stopped reporting first, its last line: started")
    wait_until(lambda: Task.objects.get(pk=task.pk).state == "killed", timeout=20, what="the process killed")
    assert gone(task.pid)


def test_a_lost_host_restarts_the_job_on_the_capacity_left(api, hosts, start_agent):
    config = {"epochs": 8, "per_replica_batch": 32, "steps_per_epoch": 30}
    job_id = builtin_job(api, "multi_worker_mirrored", config, workers=2, devices_per_worker=1)
    first = wait_for_job(job_id, ("running",), timeout=90)
    tasks = list(Task.objects.filter(job=first, attempt=1))
    victim_host = next(t for t in tasks if t.index == 1).host
    agent = next(p for p in start_agent.started if p.name == f"agent-{victim_host.name}")  # type: ignore[attr-defined]

    agent.kill()  # the host is gone: its agent and (below) the TF processes it ran
    for task in tasks:
        if task.host_id == victim_host.pk:
            kill(task.pid)

    job = wait_for_job(job_id, timeout=240)
    assert job.state == "succeeded", job.reason
    assert job.restart_reason.startswith(f"host {victim_host.name} went offline; lost ")
    assert Host.objects.get(pk=victim_host.pk).status == HostStatus.OFFLINE
    second = list(Task.objects.filter(job=job, attempt=2))
    assert len(second) == 2
    assert victim_host.pk not in {t.host_id for t in second}
