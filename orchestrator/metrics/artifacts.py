"""Artifacts (the final model): a file a task produced, checked (name, size, hash) and stored under its job, within
the job's limits on count and total bytes (limits.artifact_problem); a refusal is counted and shown on the job page.
An artifact never replaces one of the same name sent later (by the sealed times): a late or replayed entry is
refused and counted."""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import re
from typing import Any

from django.db import transaction
from django.db.models import Count, F, Sum

from contracts.limits import MAX_ARTIFACT_BYTES
from contracts.metric_messages import TaskArtifact
from contracts.names import artifact_name_problem
from contracts.protocol import TASK_ARTIFACT
from contracts.store import ARTIFACT_SLOTS, MAX_STORE_ARTIFACT_BYTES, artifact_key
from orchestrator import limits
from orchestrator.identity.stream_marks import Appended
from orchestrator.metrics import live
from orchestrator.metrics.lookups import task_of
from orchestrator.models import Job, JobArtifact, Task
from orchestrator.objectstore import store as storage
from orchestrator.plumbing import counters

log = logging.getLogger(__name__)

SHA256 = re.compile(r"^[0-9a-f]{64}$")
OUTDATED = "artifacts_outdated"  # older than the stored artifact of that name: not stored


def handle_task_artifact(payload: Any, appended: Appended | None = None) -> JobArtifact | None:
    """Store an artifact report (`appended`: the stream entry it came in, lookups.opened)."""
    found = task_of(payload, TASK_ARTIFACT, TaskArtifact, appended)
    if found is None:
        return None
    task, artifact, sent_at = found
    if artifact_name_problem(artifact.name):
        log.warning("artifact with a bad name %r from task %s dropped", artifact.name, task.pk)
        return None
    if artifact.slot != -1:
        return _in_store(task, artifact, sent_at)
    try:
        content = base64.b64decode(artifact.content_b64, validate=True)
    except (binascii.Error, ValueError, TypeError):
        log.warning("artifact %s of task %s is not base64", artifact.name, task.pk)
        return None
    if len(content) > MAX_ARTIFACT_BYTES or hashlib.sha256(content).hexdigest() != artifact.sha256:
        log.warning("artifact %s of task %s is too large or its hash does not match", artifact.name, task.pk)
        return None
    return _record(task, artifact, sent_at, len(content), content=content)


def _in_store(task: Task, artifact: TaskArtifact, sent_at: float) -> JobArtifact | None:
    """An artifact the agent uploaded to the object store: its slot must be one of the task attempt's, and the
    stored object must have the size the agent reports (the SHA-256 is the agent's, hashed as it sent the bytes,
    and checked again by whoever downloads it)."""
    cluster = task.job.cluster
    size = artifact.size
    if not cluster.has_store or not isinstance(artifact.slot, int) or not 0 <= artifact.slot < ARTIFACT_SLOTS:
        log.warning("artifact %s of task %s names no slot of the task's in a store", artifact.name, task.pk)
        return None
    if not isinstance(size, int) or not 0 <= size <= MAX_STORE_ARTIFACT_BYTES or not SHA256.match(artifact.sha256):
        log.warning("artifact %s of task %s: bad size or SHA-256", artifact.name, task.pk)
        return None
    key = artifact_key(task.job_id, task.pk, task.attempt, artifact.slot)
    stored = storage.object_size(cluster, key)
    if stored != size:
        log.warning("artifact %s of task %s: the store holds %s bytes at its key, not %s", artifact.name, task.pk,
                    stored, size)  # fmt: skip
        return None
    recorded = _record(task, artifact, sent_at, size, key=key)
    if recorded is None:
        storage.delete(cluster, key)  # refused (limits, outdated): no row names it
    return recorded


def _record(
    task: Task, artifact: TaskArtifact, sent_at: float, size: int, *, content: bytes = b"", key: str = ""
) -> JobArtifact | None:
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
        problem = limits.artifact_problem(artifact.name, size, held["count"], held["total"] or 0, in_store=bool(key))
        if problem:
            log.warning("job %s: %s", task.job_id, problem)
            Job.objects.filter(pk=task.job_id).update(
                artifacts_refused=F("artifacts_refused") + 1, artifact_refusal=problem
            )
            live.job_changed(task.job_id)  # the job page shows the refusal
            return None
        replaced = JobArtifact.objects.filter(job_id=task.job_id, name=artifact.name).exclude(key="").exclude(key=key)
        old_keys = list(replaced.values_list("key", flat=True))
        stored, _ = JobArtifact.objects.update_or_create(
            job_id=task.job_id,
            name=artifact.name,
            defaults={
                "task": task,
                "sha256": artifact.sha256,
                "size": size,
                "content": content,
                "key": key,
                "sent_at": sent_at,
            },
        )
    for old in old_keys:  # an earlier attempt's object of that name: no row names it any more
        storage.delete(task.job.cluster, old)
    return stored
