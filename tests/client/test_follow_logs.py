"""`tfdash logs JOB --task worker:0 -f` right after `tfdash submit`: the job may wait seconds for a scheduler pass
(passes over a cluster begin TFDASH_SCHEDULE_INTERVAL_S apart), so the follow waits for its tasks instead of refusing
a task the job has not got yet; a task name the job's tasks do not have is still refused. The client runs in-process
against the real API (httpx's WSGI transport), and the job's rows move between its polls."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from django.core.wsgi import get_wsgi_application
from django.utils import timezone
from tfdash import api_logs
from tfdash.client import Client, NotFound

from orchestrator.identity import api_tokens
from orchestrator.models import Job, JobState, Task, TaskLogLine
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)  # each WSGI request closes the connection at its end


def _client(user: Any) -> Client:
    token = api_tokens.issue(user)[0]
    return Client("http://testserver", token, transport=httpx.WSGITransport(app=get_wsgi_application()))


def _client_sleeps_with(monkeypatch: pytest.MonkeyPatch, sleep: Any) -> None:
    # The client module's clock only: patching time.sleep itself would reach every thread of the test process (the
    # fast tier's TensorFlow watch sleeps between its looks, tests/conftest.py) and call `sleep` from them too.
    monkeypatch.setattr(api_logs, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))


def _queued_job(owner: Any) -> Job:
    host, _token = factories.host("follow-0")
    return Job.objects.create(owner=owner, cluster=host.cluster, name="queued", strategy="mirrored", workers=1)


def test_a_follow_started_before_placement_prints_the_named_tasks_lines_once_it_runs(alice, monkeypatch):
    job = _queued_job(alice)
    rounds: list[str] = []

    def between_polls(_seconds: float) -> None:
        # The first poll found the job waiting with no tasks; it is placed, runs and ends before the next one.
        rounds.append("poll")
        if len(rounds) == 1:
            assert not Task.objects.filter(job=job).exists()
            task = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=job.cluster.hosts.get())
            TaskLogLine.objects.bulk_create(
                [TaskLogLine(task=task, seq=seq, stream="stdout", text=f"epoch {seq}") for seq in range(3)]
            )
            Job.objects.filter(pk=job.pk).update(attempt=1, state=JobState.SUCCEEDED, finished_at=timezone.now())

    _client_sleeps_with(monkeypatch, between_polls)
    with _client(alice) as api:
        lines = list(api.follow_logs(job.pk, task="worker:0", poll_s=0.01, settle_s=0))

    assert [line["text"] for line in lines] == ["epoch 0", "epoch 1", "epoch 2"]
    assert rounds  # it waited a round: the lines were written after the follow began


def test_a_follow_of_a_task_the_job_does_not_have_is_refused_by_name(alice, monkeypatch):
    job = _queued_job(alice)
    Job.objects.filter(pk=job.pk).update(attempt=1, state=JobState.RUNNING)
    Task.objects.create(job=job, attempt=1, type="worker", index=0, host=job.cluster.hosts.get())
    _client_sleeps_with(monkeypatch, lambda _s: pytest.fail("a missing task must not be waited for"))

    with _client(alice) as api, pytest.raises(NotFound, match=r"has no task 'worker:5' \(its tasks: worker:0\)"):
        list(api.follow_logs(job.pk, task="worker:5", poll_s=0.01, settle_s=0))
