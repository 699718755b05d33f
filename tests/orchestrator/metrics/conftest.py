"""What the metrics tests share: a job with one running task on a registered host, and an agent's envelope."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from contracts.protocol import HOST_SAMPLES, METRICS_QUEUE, TASK_ARTIFACT, TASK_LOGS, TASK_METRICS
from orchestrator.metrics.stream import dead_letter_stream
from orchestrator.models import Job, Task
from tests import factories
from tests.support.wire import sealed


@pytest.fixture
def stream(redis_url: str) -> Iterator[tuple[redis.Redis, str]]:
    """A stream of this test's own on the test Redis (the session's ingest reads only METRICS_QUEUE)."""
    client = redis.Redis.from_url(redis_url)
    name = f"{METRICS_QUEUE}:test-{uuid.uuid4().hex[:8]}"
    yield client, name
    client.delete(name, dead_letter_stream(name))


@pytest.fixture
def running(django_user_model):  # type: ignore[no-untyped-def]
    """(owner, host, token, job, task): a MultiWorkerMirrored job whose worker 0 runs on host node-0."""
    owner = django_user_model.objects.create_user("alice", password="pw-alice-123")
    host, token = factories.host("node-0")
    job = Job.objects.create(
        owner=owner, cluster=host.cluster, name="j", strategy="multi_worker_mirrored", program_kind="script", attempt=1
    )
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=host, state="running")
    return owner, host, token, job, task


def envelope(host: Any, token: str, body: Any, name: str = "") -> dict[str, Any]:
    """What an agent's outbox sends: the body sealed by the host (contracts/signing.py) as report `name`, by default
    the kind of report the body is."""
    return sealed(host.name, token, name or _kind_of(body), body)


def _kind_of(body: Any) -> str:
    if not isinstance(body, dict):
        return TASK_METRICS
    for field, name in (("events", TASK_METRICS), ("samples", HOST_SAMPLES), ("lines", TASK_LOGS)):
        if field in body:
            return name
    return TASK_ARTIFACT
