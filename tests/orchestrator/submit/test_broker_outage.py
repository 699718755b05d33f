"""What a user does while Redis is away still works: the job is stored (201, not a 500 for a job that was saved),
a cancel is stored, and what could not be sent is made good later (the watchdog's scheduler passes, the heartbeat's
convergence resending orders stamped as sent)."""

from __future__ import annotations

import kombu.exceptions
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from orchestrator.jobs import dispatch, lifecycle
from orchestrator.models import Host, Job, JobState, Task, TaskState
from orchestrator.plumbing import broker_sends
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker_down(monkeypatch):
    def refuse(*args, **kwargs):
        raise kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    # The one Celery app the control plane sends with, through one send (orchestrator/plumbing/broker_sends.py).
    monkeypatch.setattr(broker_sends.app, "send_task", refuse)
    assert dispatch.app is broker_sends.app


def test_a_job_submitted_while_the_broker_is_down_is_stored_and_queued(
    alice, broker_down, caplog, django_capture_on_commit_callbacks
):
    host, _ = factories.host("outage-0")
    Host.objects.filter(pk=host.pk).update(status="online", cpu_count=2)
    api = APIClient()
    api.force_authenticate(alice)

    with caplog.at_level("WARNING"), django_capture_on_commit_callbacks(execute=True):
        response = api.post(
            "/api/jobs/",
            {"name": "during an outage", "strategy": "mirrored", "workers": 1, "devices_per_worker": 1,
             "script": SimpleUploadedFile("train.py", b"print('hi')\n")},
            format="multipart",
        )  # fmt: skip

    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).state == JobState.QUEUED
    assert "the watchdog's next one will do" in caplog.text


def test_a_cancel_while_the_broker_is_down_is_stored_and_its_kills_stamped_for_resending(
    alice, broker_down, django_capture_on_commit_callbacks
):
    host, _ = factories.host("outage-1")
    job = Job.objects.create(
        owner=alice, cluster=host.cluster, name="j", strategy="mirrored", program_kind="script", attempt=1,
        state=JobState.RUNNING,
    )  # fmt: skip
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=host, state=TaskState.RUNNING, pid=9)

    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.cancel(job.pk, "alice")

    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    task.refresh_from_db()
    assert task.state == TaskState.STOPPING and task.ordered_at is not None  # convergence resends the kill
