"""Schemathesis against /api/schema/, in process, signed in: no server error and every response as the schema says.

Every operation of the schema is exercised twice per example: once with the path ids Hypothesis drew (mostly ids
that do not exist) and once with the ids of real rows (a cluster with a host, a job with a task, metrics, a log
line and an artifact, an experiment that job is a run of), so the fuzzer reaches the code behind the 404s too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from orchestrator.identity import api_tokens
from orchestrator.models import Experiment, Job, JobArtifact, MetricPoint, Task, TaskLogLine
from tests import factories

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

# The fuzz drives the WSGI app in process; the log, metrics-CSV and TensorBoard downloads stream async iterators,
# which Django then reads whole into memory and says so, once per such request (48 warnings a run). The product
# serves them through ASGI (Daphne), where they stream.
pytestmark = pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators:Warning")


@dataclass
class World:
    token: str
    cluster_id: int
    host_id: int
    job_id: int
    task_id: int
    experiment_id: int

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Token {self.token}"}

    def real_ids(self, path: str) -> dict[str, Any]:
        """Path parameters naming rows that exist, for the operation at `path`."""
        if path.startswith("/api/clusters/{cluster_pk}/hosts/"):
            return {"cluster_pk": self.cluster_id, "id": self.host_id}
        if path.startswith("/api/clusters/"):
            return {"id": self.cluster_id}
        if path.startswith("/api/experiments/"):
            return {"id": self.experiment_id}
        return {"id": self.job_id, "task_id": self.task_id, "name": "model.keras"}


@pytest.fixture
def world(django_user_model) -> World:
    staff = django_user_model.objects.create_user("sam", password="pw-sam-123", is_staff=True)
    owner = django_user_model.objects.create_user("alice", password="pw-alice-123")
    host, _token = factories.host("node-0")
    job = Job.objects.create(
        owner=owner, cluster=host.cluster, name="j", strategy="multi_worker_mirrored", program_kind="script", attempt=1
    )
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=host, port=24000, state="running")
    TaskLogLine.objects.create(task=task, seq=1, stream="stdout", text="epoch 1")
    MetricPoint.objects.create(job=job, task=task, phase="train", name="loss", step=1, value=0.5, ts=1.0)
    content = b"not really a model"
    JobArtifact.objects.create(
        job=job, task=task, name="model.keras", sha256=hashlib.sha256(content).hexdigest(), size=len(content),
        content=content,
    )  # fmt: skip
    experiment = Experiment.objects.create(
        owner=owner, cluster=host.cluster, name="e", template={"program_kind": "builtin", "builtin": "digits_mlp"},
        variants=[
            {"label": "1-replica baseline", "strategy": "mirrored", "workers": 1, "ps": 0, "devices_per_worker": 1},
            {"label": "MultiWorkerMirrored 2 × 1", "strategy": "multi_worker_mirrored", "workers": 2, "ps": 0,
             "devices_per_worker": 1},
        ],
    )  # fmt: skip
    Job.objects.filter(pk=job.pk).update(experiment=experiment, variant="MultiWorkerMirrored 2 × 1")
    token, _row = api_tokens.issue(staff)
    return World(
        token=token,
        cluster_id=host.cluster_id,
        host_id=host.pk,
        job_id=job.pk,
        task_id=task.pk,
        experiment_id=experiment.pk,
    )


@pytest.fixture
def api_schema(db: None, world: World) -> Iterator[Any]:
    # The app runs in this thread on the test's own connection, inside its transaction: like Django's test client,
    # keep the end of each request from closing that connection.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        # The schema itself is only served to signed-in users.
        yield schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application(), headers=world.headers)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


schema = schemathesis.pytest.from_fixture("api_schema")


# One test runs every operation of the schema (about 45, 15 examples each, most twice): 250 s on a quiet shared
# machine, past the suite's 300 s per test when it is busy; the budget is the whole schema's, not one request's.
@pytest.mark.timeout(900)
@schema.parametrize()
@settings(
    max_examples=15,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_answers_without_server_errors_and_as_the_schema_says(case: Any, world: World) -> None:
    case.call_and_validate(headers=world.headers, checks=CHECKS)
    if case.path_parameters:
        real = world.real_ids(case.operation.path)
        case.path_parameters = {key: real.get(key, value) for key, value in case.path_parameters.items()}
        case.call_and_validate(headers=world.headers, checks=CHECKS)
