"""Artifacts from agents (metrics/artifacts.py): checked, stored under their job, downloadable by its owner only."""

from __future__ import annotations

import base64
import hashlib
import time

import pytest
from rest_framework.test import APIClient

from contracts.protocol import TASK_ARTIFACT
from orchestrator.metrics import artifacts, ingest
from orchestrator.models import JobArtifact
from orchestrator.plumbing import counters
from tests.orchestrator.metrics.conftest import envelope
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db


def test_an_artifact_is_stored_and_downloadable_by_its_owner_only(running, django_user_model):
    owner, host, token, job, task = running
    content = b"model bytes" * 100
    body = {
        "task_id": task.pk,
        "attempt": 1,
        "name": "model.keras",
        "sha256": hashlib.sha256(content).hexdigest(),
        "content_b64": base64.b64encode(content).decode(),
    }

    artifacts.handle_task_artifact(envelope(host, token, body))
    artifacts.handle_task_artifact(envelope(host, token, {**body, "sha256": "0" * 64}))  # corrupt: dropped

    assert JobArtifact.objects.get(job=job).size == len(content)
    client = APIClient()
    client.force_authenticate(owner)
    response = client.get(f"/api/jobs/{job.pk}/artifacts/model.keras/")
    assert response.content == content
    assert "attachment" in response["Content-Disposition"]
    client.force_authenticate(django_user_model.objects.create_user("bob", password="pw-bob-123"))
    assert client.get(f"/api/jobs/{job.pk}/artifacts/model.keras/").status_code == 404


def test_a_replayed_older_artifact_leaves_the_newer_one_in_place(running):
    _owner, host, token, job, task = running
    now = time.time()

    def sent(content: bytes, at: float) -> dict:
        body = {
            "task_id": task.pk,
            "attempt": 1,
            "name": "model.keras",
            "sha256": hashlib.sha256(content).hexdigest(),
            "content_b64": base64.b64encode(content).decode(),
        }
        return sealed(host.name, token, TASK_ARTIFACT, body, now=at)

    older, newer = sent(b"epoch 1 weights", now - 60), sent(b"epoch 2 weights", now - 30)
    outdated = counters.get(artifacts.OUTDATED)

    assert ingest.store_reports([(TASK_ARTIFACT, older)]).artifacts == 1
    assert ingest.store_reports([(TASK_ARTIFACT, newer)]).artifacts == 1
    assert ingest.store_reports([(TASK_ARTIFACT, older)]).artifacts == 0  # the stream entry again, replayed

    stored = JobArtifact.objects.get(job=job, name="model.keras")
    assert (bytes(stored.content), stored.sent_at) == (b"epoch 2 weights", pytest.approx(now - 30, abs=1e-3))
    assert counters.get(artifacts.OUTDATED) - outdated == 1
    assert ingest.store_reports([(TASK_ARTIFACT, newer)]).artifacts == 1  # the same one again changes nothing
    assert bytes(JobArtifact.objects.get(pk=stored.pk).content) == b"epoch 2 weights"
