"""Artifacts from agents (metrics/artifacts.py): checked, stored under their job, downloadable by its owner only."""

from __future__ import annotations

import base64
import hashlib

import pytest
from rest_framework.test import APIClient

from orchestrator.metrics import artifacts
from orchestrator.models import JobArtifact
from tests.orchestrator.metrics.conftest import envelope

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
