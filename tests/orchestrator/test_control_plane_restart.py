"""The orchestrator and the web server killed mid-job and started again (their own stack, as in the Redis-restart
test): the job goes on and succeeds, no host is declared lost for the control plane's own absence, and every log line
and metric point of the outage is stored (agents keep queueing them in Redis meanwhile)."""

from __future__ import annotations

import time

import pytest
import requests
from django.conf import settings

from orchestrator.models import Host, HostStatus, Job, MetricPoint, TaskLogLine
from tests.orchestrator.test_redis_restart import (  # noqa: F401 - the fixtures are used by name
    DB,
    EPOCHS,
    STEPS_PER_EPOCH,
    Deployment,
    _diagnose,
    _epochs_stored,
    _wait,
    api_token,
    deployment,
    private_redis,
    two_hosts,
)
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True, databases=[DB])


def test_a_job_goes_on_while_the_orchestrator_and_web_server_are_restarted(
    deployment: Deployment,  # noqa: F811 - pytest fixtures, imported above
    two_hosts: dict[str, str],  # noqa: F811
    api_token: str,  # noqa: F811
) -> None:
    deployment.label = "control-plane-restart"
    deployment.start(two_hosts)
    wait_until(lambda: Host.objects.using(DB).filter(status=HostStatus.ONLINE).count() == 2, 30, what="2 hosts online")
    config = {"epochs": EPOCHS, "steps_per_epoch": STEPS_PER_EPOCH, "per_replica_batch": 32, "checkpoint": False}
    response = requests.post(
        f"{deployment.web_url}/api/jobs/",
        json={"name": "digits through a control-plane restart", "strategy": "multi_worker_mirrored", "workers": 2,
              "ps": 0, "devices_per_worker": 1, "builtin": "digits_mlp", "builtin_config": config},
        headers={"Authorization": f"Token {api_token}"},
        timeout=30,
    )  # fmt: skip
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    _wait(lambda: _epochs_stored(job_id, 2) == 2, 120, job_id, deployment, "both workers' epoch 2 stored")

    deployment.kill("orchestrator")
    deployment.kill("web")
    # The outage itself (nothing to wait for), longer than the heartbeat timeout: every host's last stored heartbeat
    # is stale when the orchestrator is back.
    time.sleep(settings.TFDASH_HEARTBEAT_TIMEOUT_S + 2)
    deployment.start_again("orchestrator")
    deployment.start_again("web")

    job = _wait(lambda: (j := Job.objects.using(DB).get(pk=job_id)).is_terminal and j, 150, job_id, deployment,
                "the job to end")  # fmt: skip
    assert job.state == "succeeded", (job.reason, _diagnose(job_id, deployment))
    assert (job.attempt, job.restarts) == (1, 0)
    assert Host.objects.using(DB).filter(status=HostStatus.ONLINE).count() == 2
    orchestrator_log = deployment.output("orchestrator")
    assert "is offline" not in orchestrator_log, orchestrator_log[-3000:]
    # What the agents reported while nobody listened was queued and stored once the orchestrator was back: every
    # epoch's end point and "Epoch N/EPOCHS" log line, for both workers.
    tasks = list(job.current_tasks())
    for task in tasks:
        epochs = set(
            MetricPoint.objects.using(DB)
            .filter(task=task, phase="epoch_end", name="loss")
            .values_list("epoch", flat=True)
        )
        assert epochs == set(range(1, EPOCHS + 1)), (task.label, sorted(epochs))
        # Lines travel on the metric stream, beside (not before) the exit: give the ingest its moment.
        wanted = {f"Epoch {e}/{EPOCHS}" for e in range(1, EPOCHS + 1)}
        wait_until(
            lambda task=task, wanted=wanted: (
                wanted <= set(TaskLogLine.objects.using(DB).filter(task=task).values_list("text", flat=True))
            ),
            30,
            what=f"every epoch's line of {task.label}",
        )
    # The new web server serves the job.
    page = requests.get(
        f"{deployment.web_url}/api/jobs/{job_id}/", headers={"Authorization": f"Token {api_token}"}, timeout=30
    )
    assert page.json()["state"] == "succeeded"
