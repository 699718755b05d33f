"""Storage that follows the job, end to end: real agents, real TensorFlow, a real moto server process (behind its
SigV4 gate, tests/support/object_store.py), no shared folder. A gang whose chief's host is lost resumes on other hosts
from the checkpoint in the store; a 100 MB artifact goes from the host to the store and back to a user by sha256."""

from __future__ import annotations

import hashlib
import json
import textwrap

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.wsgi import get_wsgi_application
from tfdash.client import Client

from contracts.store import manifest_from, manifest_key
from orchestrator.identity import api_tokens
from orchestrator.models import Host, HostStatus, JobArtifact, Task
from tests import factories
from tests.orchestrator.test_faults_e2e import builtin_job, epochs_done, kill
from tests.orchestrator.test_jobs_e2e import log_text, wait_for_job
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cluster_with_a_store(orchestrator, start_agent, object_store):  # type: ignore[no-untyped-def]
    """`make(n, prefix, first_port)`: n hosts of one device slot each, real agents, the store and no shared folder:
    a job's checkpoints can reach another host only through the store."""

    def make(n: int, prefix: str, first_port: int):  # type: ignore[no-untyped-def]
        cluster = factories.cluster()
        object_store.use_for(cluster)
        for i in range(n):
            host, token = factories.host(f"{prefix}-{i}", port_min=first_port + 10 * i)
            Host.objects.filter(pk=host.pk).update(port_max=first_port + 10 * i + 9, cpu_slots=1)
            start_agent(host.name, token)
        wait_until(lambda: Host.objects.filter(status=HostStatus.ONLINE).count() == n, 30, what=f"{n} hosts online")
        return cluster

    return make


def stored_epoch(store, job_id: int) -> int:  # type: ignore[no-untyped-def]
    try:
        raw = store.client().get_object(Bucket=store.bucket, Key=manifest_key(job_id))["Body"].read()
    except Exception:  # none yet
        return 0
    return manifest_from(raw).epoch or 0


def test_a_gang_whose_chiefs_host_is_lost_resumes_elsewhere_from_the_stores_checkpoint(
    api, cluster_with_a_store, start_agent, object_store, orchestrator, open_tmp
):
    cluster_with_a_store(3, "st", 29300)
    config = {"epochs": 8, "per_replica_batch": 32, "steps_per_epoch": 60}
    job_id = builtin_job(api, "multi_worker_mirrored", config, workers=2, devices_per_worker=1)
    first = wait_for_job(job_id, ("running",), timeout=90)
    chief = Task.objects.get(job=first, attempt=1, type="worker", index=0)
    try:
        wait_until(lambda: stored_epoch(object_store, job_id) >= 3, timeout=150, what="epoch 3 in the store")
    except AssertionError:
        files = sorted(str(p.relative_to(open_tmp)) for p in open_tmp.rglob("checkpoints/**/*"))
        raise AssertionError(f"{epochs_done(chief)}\n{files}\n{agents_said(start_agent, orchestrator)}") from None
    lost = chief.host
    agent = next(p for p in start_agent.started if p.name == f"agent-{lost.name}")  # type: ignore[attr-defined]

    agent.kill()  # the host is gone, its disk with it: the agent and the TF process it ran
    kill(chief.pid)

    job = wait_for_job(job_id, timeout=240)
    # Its survivor fails first (exit 1, UnavailableError); the job waits for the host's verdict and restarts.
    again = Task.objects.filter(job=job, attempt=2, type="worker", index=0).first()
    assert again is not None, (job.state, job.reason, agents_said(start_agent, orchestrator, "lifecycle"))
    assert job.state == "succeeded", (job.reason, log_text(again)[-3000:])
    assert job.restart_reason.startswith(f"host {lost.name} went offline")
    assert again.host_id != lost.pk
    resumed = again.facts["resumed_from_epoch"]
    # It resumed from the store (at least the epoch the store held when the host went), not from epoch 1.
    assert resumed >= 3
    assert epochs_done(again) == list(range(resumed + 1, 9))
    assert epochs_done(again)[0] >= 4


SCRIPT = textwrap.dedent(
    """
    import hashlib, json, os
    path = os.path.join(os.environ["TFDASH_JOB_DIR"], "weights.bin")
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        for _ in range(101):
            chunk = os.urandom(1 << 20)
            digest.update(chunk)
            out.write(chunk)
    print("sha256", digest.hexdigest(), flush=True)
    line = json.dumps({"kind": "artifact", "name": "weights.bin", "path": path}) + "\\n"
    os.write(int(os.environ["TFDASH_METRICS_FD"]), line.encode())
    """
)


def agents_said(start_agent, orchestrator, pattern: str = "store|artifact|checkpoint") -> str:  # type: ignore[no-untyped-def]
    """What the agents and the orchestrator logged about the store (for a failure's message)."""
    import re

    lines = [line for p in [*start_agent.started, orchestrator] for line in p.output().splitlines()]
    return "\n".join(line for line in lines if re.search(pattern, line, re.I))[-6000:]


def test_a_100_mb_artifact_round_trips_through_the_store_by_sha256(
    api, alice, cluster_with_a_store, object_store, start_agent, orchestrator
):
    cluster_with_a_store(1, "sa", 29400)
    response = api.post(
        "/api/jobs/",
        {"name": "big artifact", "strategy": "mirrored", "script": SimpleUploadedFile("big.py", SCRIPT.encode())},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    job = wait_for_job(job_id, timeout=120)
    task = Task.objects.get(job=job)
    assert job.state == "succeeded", (job.reason, log_text(task)[-2000:])
    made = wait_until(lambda: "sha256 " in log_text(task) and log_text(task).split("sha256 ")[1][:64], 30)
    try:
        artifact = wait_until(lambda: JobArtifact.objects.filter(job=job, name="weights.bin").first(), 60)
    except AssertionError:
        raise AssertionError(agents_said(start_agent, orchestrator)) from None

    # Stored in the store under the task's own key; the database holds its name, size, hash and key, no bytes.
    assert (artifact.sha256, artifact.size, bytes(artifact.content)) == (made, 101 * 2**20, b"")
    assert artifact.key == f"jobs/{job_id}/artifacts/{task.pk}-{task.attempt}-0"
    head = object_store.client().head_object(Bucket=object_store.bucket, Key=artifact.key)
    assert head["ContentLength"] == 101 * 2**20
    # The API redirects to a presigned GET of that key, and says what hash to expect.
    answer = api.get(f"/api/jobs/{job_id}/artifacts/weights.bin/")
    assert answer.status_code == 302 and answer["X-Content-SHA256"] == made
    assert answer["Location"].startswith(f"{object_store.endpoint}/{object_store.bucket}/{artifact.key}?")
    digest = hashlib.sha256()
    with httpx.stream("GET", answer["Location"], timeout=60) as fetched:
        assert fetched.status_code == 200
        for chunk in fetched.iter_bytes():
            digest.update(chunk)
    assert digest.hexdigest() == made
    # And the Python client (the CLI's `tfdash artifacts ID --name weights.bin`) follows it, checked by hash.
    token = api_tokens.issue(alice)[0]
    client = Client("http://testserver", token, transport=httpx.WSGITransport(app=get_wsgi_application()))
    saved = client.download_artifact(job_id, "weights.bin", folder=str(object_store.credentials_file.parent / "dl"))
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == made
    saved.unlink()
    listing = json.loads(json.dumps(client.artifacts(job_id), default=str))
    assert [(a["name"], a["size"], a["sha256"]) for a in listing] == [("weights.bin", 101 * 2**20, made)]
