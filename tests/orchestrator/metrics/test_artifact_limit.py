"""Artifacts per job: past TFDASH_MAX_ARTIFACTS_PER_JOB or TFDASH_MAX_ARTIFACT_BYTES_PER_JOB an artifact is refused
(through the real stream), counted, and the job page says why; what was stored stays."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest
from django.test import override_settings

from contracts.protocol import TASK_ARTIFACT
from orchestrator.metrics.stream import MetricsConsumer
from orchestrator.models import Job, JobArtifact, Task
from tests.orchestrator.metrics.conftest import consumer, envelope

pytestmark = pytest.mark.django_db(transaction=True)


def artifact(host: Any, token: str, task: Task, name: str, content: bytes) -> dict[str, str]:
    body = {"task_id": task.pk, "attempt": 1, "name": name, "sha256": hashlib.sha256(content).hexdigest(),
            "content_b64": base64.b64encode(content).decode()}  # fmt: skip
    return {"name": TASK_ARTIFACT, "envelope": json.dumps(envelope(host, token, body))}


def stored(job: Job) -> dict[str, bytes]:
    return {a.name: bytes(a.content) for a in JobArtifact.objects.filter(job=job)}


def send(stream: Any, *entries: dict[str, str]) -> MetricsConsumer:
    client, name = stream
    reader = consumer(client, name)
    for fields in entries:
        client.xadd(name, fields)
    while reader.drain_once():
        pass
    return reader


@override_settings(TFDASH_MAX_ARTIFACTS_PER_JOB=2, TFDASH_MAX_ARTIFACT_BYTES_PER_JOB=1000)
def test_one_artifact_too_many_is_refused_and_the_page_says_why(stream, running, client):
    owner, host, token, job, task = running
    reader = send(
        stream,
        artifact(host, token, task, "a.keras", b"a" * 100),
        artifact(host, token, task, "b.keras", b"b" * 100),
        artifact(host, token, task, "a.keras", b"A" * 200),  # a new version of one stored: replaces it, no new room
        artifact(host, token, task, "c.keras", b"c" * 100),
    )

    assert stored(job) == {"a.keras": b"A" * 200, "b.keras": b"b" * 100}
    assert reader.dead == 0
    job.refresh_from_db()
    message = "Artifact c.keras was refused: the job already has 2 artifacts, as many as allowed " \
        "(TFDASH_MAX_ARTIFACTS_PER_JOB=2)."  # fmt: skip
    assert (job.artifacts_refused, job.artifact_refusal) == (1, message)
    client.force_login(owner)
    assert f"1 artifact refused. Latest: {message}" in client.get(f"/jobs/{job.pk}/").content.decode()


@override_settings(TFDASH_MAX_ARTIFACTS_PER_JOB=5, TFDASH_MAX_ARTIFACT_BYTES_PER_JOB=1000)
def test_an_artifact_past_the_jobs_bytes_is_refused(stream, running, client):
    owner, host, token, job, task = running
    send(
        stream,
        artifact(host, token, task, "a.keras", b"a" * 600),
        artifact(host, token, task, "b.keras", b"b" * 401),
        artifact(host, token, task, "c.keras", b"c" * 400),
    )

    assert stored(job) == {"a.keras": b"a" * 600, "c.keras": b"c" * 400}
    job.refresh_from_db()
    assert job.artifacts_refused == 1
    assert job.artifact_refusal == (
        "Artifact b.keras (401 bytes) was refused: it would bring the job's artifacts to 1,001 bytes, past the limit "
        "of 1,000 bytes (TFDASH_MAX_ARTIFACT_BYTES_PER_JOB)."
    )
    client.force_login(owner)
    assert "1,001 bytes, past the limit" in client.get(f"/jobs/{job.pk}/").content.decode().replace("&#x27;", "'")
