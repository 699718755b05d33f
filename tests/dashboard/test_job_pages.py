"""Job pages: login and ownership on every one, the form's inline errors, what a failed job shows."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from orchestrator.models import Host, Job, Task, TaskLogLine
from tests import factories
from tests.support.streaming import streamed

pytestmark = pytest.mark.django_db


@pytest.fixture
def online_hosts():
    hosts = [factories.host(f"node-{i}", port_min=26000 + 100 * i)[0] for i in range(2)]
    Host.objects.update(status="online", cpu_count=2)
    return hosts


def a_job(owner, **fields) -> Job:
    defaults = {"name": "mnist", "strategy": "multi_worker_mirrored", "program_kind": "script", "workers": 2}
    return Job.objects.create(owner=owner, cluster=factories.cluster(), **{**defaults, **fields})


def form_data(cluster_id: int, **overrides):
    data = {
        "name": "mw",
        "cluster": str(cluster_id),
        "strategy": "multi_worker_mirrored",
        "workers": "2",
        "ps": "0",
        "devices_per_worker": "1",
        "max_restarts": "0",
        "legacy_keras": "on",
        "startup_deadline_s": "120",
        "args": "--epochs 2",
        "script": SimpleUploadedFile("train.py", b"print('hi')\n"),
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize("path", ["/jobs/", "/jobs/new/", "/jobs/1/", "/jobs/1/live/", "/jobs/1/tasks/1/log/"])
def test_job_pages_need_a_login(client, path):
    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_another_users_job_is_not_found(client, alice, bob):
    job = a_job(alice)
    task = Task.objects.create(job=job, type="worker", index=0)
    client.force_login(bob)

    for path in (f"/jobs/{job.pk}/", f"/jobs/{job.pk}/live/", f"/jobs/{job.pk}/tasks/{task.pk}/log/"):
        assert client.get(path).status_code == 404, path
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 404
    assert Job.objects.get(pk=job.pk).state == "queued"
    assert "mnist" not in client.get("/jobs/").content.decode()


def test_the_form_creates_a_queued_job_and_shows_it(client, alice, online_hosts):
    client.force_login(alice)

    response = client.post("/jobs/new/", form_data(online_hosts[0].cluster_id))

    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.args == ["--epochs", "2"] and job.owner == alice
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-state">queued' in page


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"strategy": "parameter_server", "ps": "0"}, "ps", "parameter_server needs at least 1 ps"),
        ({"devices_per_worker": "3"}, None, "needs 3 devices on one host; the largest host has 2"),
        ({"script": SimpleUploadedFile("train.py", b"def broken(:\n")}, "script", "Syntax error in train.py line 1"),
        ({"args": "--out 'unclosed"}, "args", "Cannot split the arguments"),
    ],
)
def test_a_bad_form_shows_the_error_next_to_its_field_and_creates_nothing(
    client, alice, online_hosts, overrides, field, message
):
    client.force_login(alice)

    page = client.post("/jobs/new/", form_data(online_hosts[0].cluster_id, **overrides)).content.decode()

    assert message in page
    if field:
        assert f'id="error-{field}"' in page
    assert not Job.objects.exists()


def test_a_failed_job_names_its_task_exit_code_and_traceback_tail(client, alice, online_hosts):
    job = a_job(alice, state="failed", reason="worker 1 on node-1 exited with code 1")
    task = Task.objects.create(job=job, attempt=0, type="worker", index=1, host=online_hosts[1], exit_code=1)
    TaskLogLine.objects.bulk_create(
        TaskLogLine(task=task, seq=i, stream="stderr", text=text)
        for i, text in enumerate(["Traceback (most recent call last):", "ValueError: <bad> shape"])
    )
    job.failed_task = task
    job.save()
    client.force_login(alice)

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    assert "worker 1 on node-1 failed with exit code 1" in page
    assert "ValueError: &lt;bad&gt; shape" in page  # escaped
    assert f"/jobs/{job.pk}/tasks/{task.pk}/log/" in page
    log_page = streamed(client.get(f"/jobs/{job.pk}/tasks/{task.pk}/log/")).decode()
    assert "Traceback (most recent call last):" in log_page


def test_the_failure_tail_is_the_error_stream_even_when_stdout_lines_arrive_late(client, alice, online_hosts):
    job = a_job(alice, state="failed")
    task = Task.objects.create(job=job, attempt=0, type="worker", index=0, host=online_hosts[0], exit_code=1)
    lines = [("stderr", "Traceback (most recent call last):"), ("stderr", "RuntimeError: boom"), ("stdout", "epoch 3")]
    TaskLogLine.objects.bulk_create(
        TaskLogLine(task=task, seq=i, stream=stream, text=text) for i, (stream, text) in enumerate(lines)
    )

    assert [line.text for line in task.log_tail()] == ["Traceback (most recent call last):", "RuntimeError: boom"]
    silent = Task.objects.create(job=job, attempt=0, type="worker", index=1, host=online_hosts[0], exit_code=1)
    TaskLogLine.objects.create(task=silent, seq=0, stream="stdout", text="only stdout")
    assert [line.text for line in silent.log_tail()] == ["only stdout"]
