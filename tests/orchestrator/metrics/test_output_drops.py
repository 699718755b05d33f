"""What an agent dropped of a task's output for the per-task bounds (contracts/publish_limits.py), through the real
stream and ingest: the running totals its reports carry are kept on the task as the highest seen (a late or repeated
report never lowers one), and the job page and the API say what was dropped."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from contracts.protocol import TASK_LOGS, TASK_METRICS
from orchestrator.models import Task
from tests.orchestrator.metrics.conftest import consumer, envelope

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 2**20


def entry(host: Any, token: str, name: str, body: dict[str, Any]) -> dict[str, str]:
    return {"name": name, "envelope": json.dumps(envelope(host, token, body, name))}


def test_dropped_output_is_kept_per_task_never_lowered_and_shown_on_the_page_and_api(stream, running, client):
    redis_client, name = stream
    owner, host, token, job, task = running
    reader = consumer(redis_client, name)
    base = {"task_id": task.pk, "attempt": 1}
    flood = {"artifacts": 997, "artifact_bytes": 997 * 64 * MIB, "metric_lines": 12}
    redis_client.xadd(name, entry(host, token, TASK_METRICS, {**base, "events": [], "dropped": flood}))
    line = [0, "stdout", "… lines dropped: 5,000 (this task wrote more than 1,024 KiB/s of output ...)"]
    redis_client.xadd(name, entry(host, token, TASK_LOGS, {**base, "lines": [line], "dropped": 5000}))
    # An older report (lower totals) read after them, and junk in the totals: neither lowers nor breaks anything.
    older = {"artifacts": 3, "artifact_bytes": 3 * 64 * MIB, "metric_lines": -4, "made_up": 10**9}
    redis_client.xadd(name, entry(host, token, TASK_METRICS, {**base, "events": [], "dropped": older}))

    while reader.drain_once():
        pass

    task = Task.objects.get(pk=task.pk)
    assert (task.artifacts_dropped, task.artifact_bytes_dropped) == (997, 997 * 64 * MIB)
    assert (task.log_lines_dropped, task.metric_lines_dropped) == (5000, 12)
    assert reader.dead == 0

    client.force_login(owner)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="output-dropped"' in page
    assert "997 artifacts (66,907,537,408 bytes)" in page
    assert "5,000 log lines" in page and "12 metric lines" in page
    api = APIClient()
    api.force_authenticate(owner)
    assert "997 artifacts" in api.get(f"/api/jobs/{job.pk}/").json()["output_dropped"]
    tasks = api.get(f"/api/jobs/{job.pk}/tasks/").json()
    rows = tasks["results"] if isinstance(tasks, dict) else tasks
    assert rows[0]["output_dropped"] == {
        "artifacts": 997,
        "artifact_bytes": 997 * 64 * MIB,
        "log_lines": 5000,
        "metric_lines": 12,
    }


def test_a_job_whose_agents_dropped_nothing_says_nothing(running, client):
    owner, _host, _token, job, _task = running
    client.force_login(owner)
    assert 'id="output-dropped"' not in client.get(f"/jobs/{job.pk}/").content.decode()
    api = APIClient()
    api.force_authenticate(owner)
    assert api.get(f"/api/jobs/{job.pk}/").json()["output_dropped"] == ""
