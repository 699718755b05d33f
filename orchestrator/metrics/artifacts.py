"""Artifacts (the final model): a file a task produced, checked (name, size, hash) and stored under its job, within
the job's limits on count and total bytes (limits.artifact_problem); a refusal is counted and shown on the job page.
An artifact never replaces one of the same name sent later (by the sealed times): a late or replayed entry is
refused and counted."""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from typing import Any

from django.db import transaction
from django.db.models import Count, F, Sum

from contracts.limits import MAX_ARTIFACT_BYTES
from contracts.names import artifact_name_problem
from contracts.protocol import TASK_ARTIFACT, TaskArtifact
from orchestrator import counters, limits
from orchestrator.metrics import live
from orchestrator.metrics.lookups import task_of
from orchestrator.models import Job, JobArtifact

log = logging.getLogger(__name__)

OUTDATED = "artifacts_outdated"  # older than the stored artifact of that name: not stored


def handle_task_artifact(payload: Any) -> JobArtifact | None:
    found = task_of(payload, TASK_ARTIFACT, TaskArtifact)
    if found is None:
        return None
    task, artifact, sent_at = found
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
    with transaction.atomic():
        # The job's row is locked: two artifacts of one job checked at once cannot both take the last place.
        Job.objects.select_for_update().filter(pk=task.job_id).values_list("pk").first()
        stored_at = JobArtifact.objects.filter(job_id=task.job_id, name=artifact.name).values_list("sent_at").first()
        if stored_at is not None and stored_at[0] is not None and sent_at < stored_at[0]:
            # A late or replayed entry: the artifact of a newer message stays.
            log.warning(
                "artifact %s of job %s: an older one (sealed at %.3f) refused", artifact.name, task.job_id, sent_at
            )
            counters.incr(OUTDATED)
            return None
        others = JobArtifact.objects.filter(job_id=task.job_id).exclude(name=artifact.name)  # a same name replaces
        held = others.aggregate(count=Count("pk"), total=Sum("size"))
        problem = limits.artifact_problem(artifact.name, len(content), held["count"], held["total"] or 0)
        if problem:
            log.warning("job %s: %s", task.job_id, problem)
            Job.objects.filter(pk=task.job_id).update(
                artifacts_refused=F("artifacts_refused") + 1, artifact_refusal=problem
            )
            live.job_changed(task.job_id)  # the job page shows the refusal
            return None
        stored, _ = JobArtifact.objects.update_or_create(
            job_id=task.job_id,
            name=artifact.name,
            defaults={
                "task": task,
                "sha256": artifact.sha256,
                "size": len(content),
                "content": content,
                "sent_at": sent_at,
            },
        )
    return stored
