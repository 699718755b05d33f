"""A job's own environment over REST (`env`), its refusals on their field, and log lines read by cursor."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from orchestrator.jobs import dispatch
from orchestrator.models import Host, Job, Task, TaskLogLine
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_hosts() -> list[Host]:
    hosts = [factories.host(f"node-{i}", port_min=26000 + 100 * i)[0] for i in range(2)]
    Host.objects.update(status="online", cpu_count=2)
    return hosts


def as_user(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def upload(**fields: Any) -> dict[str, Any]:
    return {
        "name": "env",
        "strategy": "multi_worker_mirrored",
        "workers": "2",
        "script": SimpleUploadedFile("train.py", b"print(1)\n"),
        **fields,
    }


def test_a_jobs_variables_are_stored_shown_to_who_may_see_it_and_sent_to_every_task(alice, bob, two_hosts, monkeypatch):
    env = {"DATA": "/shared/digits.npz", "OMP_NUM_THREADS": "2"}
    created = as_user(alice).post("/api/jobs/", upload(env=json.dumps(env)), format="multipart")

    assert created.status_code == 201, created.content
    job = Job.objects.get(pk=created.json()["id"])
    assert job.env == env
    assert as_user(alice).get(f"/api/jobs/{job.pk}/").json()["env"] == env
    assert as_user(bob).get(f"/api/jobs/{job.pk}/").status_code == 404
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(dispatch, "_send", lambda kind, body, host, producer=None: sent.append(body))
    tasks = [Task.objects.create(job=job, attempt=1, type="worker", index=i, host=two_hosts[i]) for i in range(2)]
    dispatch.launch_tasks([t.pk for t in tasks])
    assert [body["user_env"] for body in sent] == [env, env]
    assert "DATA" not in sent[0]["env"]  # apart from tfdash's own, so the agent can check them


def test_a_job_without_variables_sends_none_so_older_agents_still_run_it(alice, two_hosts, monkeypatch):
    created = as_user(alice).post("/api/jobs/", {"name": "plain", "builtin": "digits_mlp", "workers": 1}, format="json")
    job = Job.objects.get(pk=created.json()["id"])
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(dispatch, "_send", lambda kind, body, host, producer=None: sent.append(body))
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=two_hosts[0])

    dispatch.launch_tasks([task.pk])

    assert "user_env" not in sent[0]


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"TF_CONFIG": "{}"}, "TF_CONFIG is reserved: tfdash writes each task's cluster and role."),
        ({"LD_PRELOAD": "/x.so"}, "LD_PRELOAD is reserved"),
        ({"TFDASH_EPOCHS": "3"}, "TFDASH_EPOCHS is reserved: names starting with TFDASH_"),
        ({"BAD NAME": "x"}, "'BAD NAME' is not a variable name"),
        ({"A": 1}, "A's value must be a string"),
        ("[1]", "Give a JSON object."),
    ],
)
def test_a_bad_variable_is_refused_on_the_env_field_naming_it(alice, two_hosts, env, says):
    body = {"name": "e", "builtin": "digits_mlp", "workers": 1, "env": env}

    response = as_user(alice).post("/api/jobs/", body, format="json")

    assert response.status_code == 400
    assert any(says in message for message in response.json()["env"])
    assert not Job.objects.exists()


def test_a_config_keys_problem_comes_back_on_that_key(alice, two_hosts):
    body = {"name": "e", "builtin": "digits_mlp", "workers": 1, "builtin_config": {"epochs": 0}}

    response = as_user(alice).post("/api/jobs/", body, format="json")

    assert response.status_code == 400
    assert response.json() == {"builtin_config.epochs": ["epochs must be between 1 and 100000, not 0."]}
    unknown = as_user(alice).post("/api/jobs/", {**body, "builtin_config": {"epoch": 2}}, format="json").json()
    assert list(unknown) == ["builtin_config"]  # the config as a whole


def test_log_lines_come_by_cursor_page_after_page(alice, bob, two_hosts, monkeypatch):
    monkeypatch.setattr("orchestrator.metrics.log_reader.PAGE_LINES", 3)
    job = Job.objects.create(owner=alice, cluster=two_hosts[0].cluster, name="j", strategy="mirrored", workers=1)
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=two_hosts[0])
    TaskLogLine.objects.bulk_create(
        [TaskLogLine(task=task, seq=seq, stream="stdout", text=f"line {seq}") for seq in range(5)]
    )
    url = f"/api/jobs/{job.pk}/logs/{task.pk}/lines/"

    first = as_user(alice).get(url).json()
    second = as_user(alice).get(url, {"since": first["next"]}).json()
    third = as_user(alice).get(url, {"since": second["next"]}).json()

    assert [line["text"] for line in first["lines"]] == ["line 0", "line 1", "line 2"] and first["more"]
    assert [line["seq"] for line in second["lines"]] == [3, 4] and not second["more"]
    assert third == {"lines": [], "next": 4, "more": False}
    assert as_user(bob).get(url).status_code == 404
    assert as_user(alice).get(url, {"since": "--1"}).status_code == 400
    assert as_user(alice).get(url, {"since": "²"}).status_code == 400
