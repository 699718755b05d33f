"""What the metrics tests share: a job with one running task on a registered host, and an agent's envelope."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from contracts import broker
from contracts.protocol import HOST_SAMPLES, TASK_ARTIFACT, TASK_LOGS, TASK_METRICS
from orchestrator.metrics.stream import DEAD_LETTERS, MetricsConsumer
from orchestrator.models import Job, Task
from tests import factories
from tests.support.wire import sealed

HOST = "node-0"  # the host `running` registers


@pytest.fixture
def stream(redis_url: str) -> Iterator[tuple[redis.Redis, str]]:
    """The metrics stream of host HOST on the test Redis, and the dead letters, empty before and after (no ingest
    runs while these tests do: tests with the session's orchestrator run last)."""
    client = redis.Redis.from_url(redis_url)
    name = broker.stream(HOST, broker.METRICS)
    client.delete(name, DEAD_LETTERS)
    yield client, name
    client.delete(name, DEAD_LETTERS)


def consumer(client: redis.Redis, name: str) -> MetricsConsumer:
    """The ingest's reader of the stream `name` alone, its group made."""
    reader = MetricsConsumer(client, hosts=lambda: [broker.host_of_key(name)])
    reader.reader.ensure_groups()
    return reader


@pytest.fixture
def running(django_user_model):  # type: ignore[no-untyped-def]
    """(owner, host, token, job, task): a MultiWorkerMirrored job whose worker 0 runs on host node-0."""
    owner = django_user_model.objects.create_user("alice", password="pw-alice-123")
    host, token = factories.host(HOST)
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
