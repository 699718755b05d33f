"""The training runtime through the whole product: built-in programs under each strategy, metrics from every task,
batch and learning-rate facts, the final model as an artifact, and metrics from an unmodified user script."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from orchestrator.models import Job, MetricPoint
from tests.orchestrator.test_jobs_e2e import PROGRAMS, log_text, wait_for_job
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def three_agents(cluster_sharing_a_folder):
    return cluster_sharing_a_folder(3, "rt", 28000)


SHAPES = {
    "mirrored": {"workers": 1, "ps": 0, "devices_per_worker": 2},
    "multi_worker_mirrored": {"workers": 2, "ps": 0, "devices_per_worker": 1},
    "parameter_server": {"workers": 2, "ps": 1, "devices_per_worker": 1},
}


@pytest.mark.parametrize("strategy", list(SHAPES))
def test_the_digits_mlp_learns_under_each_strategy_and_reports_from_every_task(api, three_agents, strategy):
    config = {"epochs": 6, "per_replica_batch": 32, "learning_rate": 0.001, "scale_lr": "linear"}
    response = api.post(
        "/api/jobs/",
        {"name": f"digits {strategy}", "strategy": strategy, "builtin": "digits_mlp", "builtin_config": config,
         **SHAPES[strategy]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]

    job = wait_for_job(job_id, timeout=240)

    tasks = list(job.current_tasks())
    assert job.state == "succeeded", (job.reason, [log_text(t)[-3000:] for t in tasks])
    facts = wait_until(lambda: Job.objects.get(pk=job_id).facts, 10, what="the job's facts")
    replicas = facts["replicas_in_sync"]
    # TensorFlow's own count: 2 logical devices, 2 synchronous workers; a ParameterServer CPU worker is 1 replica
    # that applies its own updates asynchronously, so nothing is scaled there.
    assert replicas == (1 if strategy == "parameter_server" else 2)
    assert facts["global_batch"] == 32 * replicas
    assert facts["effective_learning_rate"] == pytest.approx(0.001 * replicas)
    # Its progress, kept at ingest from the chief's (worker 0's) points: the last epoch of 6, nothing left.
    progress = wait_until(
        lambda: (p := Job.objects.get(pk=job_id).progress).get("epoch") == 6 and p, 30, what="progress at epoch 6"
    )
    steps = 6 * facts["steps_per_epoch"]
    assert (progress["epochs"], progress["step"], progress["steps"], progress["eta_s"]) == (6, steps, steps, 0.0)
    assert progress["examples_per_s"] > 0 and progress["resumed_from_epoch"] == 0, progress
    # Every task reported (for ParameterServer the coordinator trains; workers and ps report their facts).
    assert all(t.facts for t in Job.objects.get(pk=job_id).current_tasks()), [t.facts for t in tasks]
    trainers = [
        t for t in tasks if t.type in ("chief", "worker") and (strategy != "parameter_server" or t.type == "chief")
    ]
    for task in trainers:
        assert MetricPoint.objects.filter(task=task, phase="train", name="loss").exists(), task
        assert MetricPoint.objects.filter(task=task, name="examples_per_s").exists(), task
    val_accuracy = (
        MetricPoint.objects.filter(job_id=job_id, phase="epoch_end", name="val_accuracy").order_by("-step").first()
    )
    assert val_accuracy is not None and val_accuracy.value >= 0.90, val_accuracy
    artifacts = api.get(f"/api/jobs/{job_id}/artifacts/").json()
    assert [a["name"] for a in artifacts] == ["model.keras"] and artifacts[0]["size"] > 0


def test_an_unmodified_user_script_reports_loss_and_throughput(api, three_agents):
    data = {
        "name": "user fit",
        "strategy": "multi_worker_mirrored",
        "workers": 2,
        "args": "--epochs 2",
        "script": SimpleUploadedFile("mwms_fit.py", (PROGRAMS / "mwms_fit.py").read_bytes()),
    }
    job_id = api.post("/api/jobs/", data, format="multipart").json()["id"]

    job = wait_for_job(job_id, timeout=180)

    assert job.state == "succeeded", job.reason
    for task in job.current_tasks():
        names = set(MetricPoint.objects.filter(task=task).values_list("name", flat=True))
        assert {"loss", "examples_per_s"} <= names, (task, names)
