"""Artifacts (the final model): a file a task produced, checked (name, size, hash) and stored under its job."""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from typing import Any

from contracts.limits import MAX_ARTIFACT_BYTES
from contracts.names import artifact_name_problem
from contracts.protocol import TASK_ARTIFACT, TaskArtifact
from orchestrator.metrics.lookups import task_of
from orchestrator.models import JobArtifact

log = logging.getLogger(__name__)


def handle_task_artifact(payload: Any) -> JobArtifact | None:
    found = task_of(payload, TASK_ARTIFACT, TaskArtifact)
    if found is None:
        return None
    task, artifact = found
    if artifact_name_problem(artifact.name):
        log.warning("artifact with a bad name %r from task %s dropped", artifact.name, task.pk)
        return None
    try:
        content = base64.b64decode(artifact.content_b64, validate=True)
    except (binascii.Error, ValueError, TypeError):
        log.warning("artifact %s of task %s is not base64", artifact.name, task.pk)
        return None
    if len(content) > MAX_ARTIFACT_BYTES or hashlib.sha256(content).hexdigest() != artifact.sha256:
        log.warning("artifact %s of task %s is too large or its hash does not match", artifact.name, task.pk)
        return None
    stored, _ = JobArtifact.objects.update_or_create(
        job_id=task.job_id,
        name=artifact.name,
        defaults={"task": task, "sha256": artifact.sha256, "size": len(content), "content": content},
    )
    return stored
