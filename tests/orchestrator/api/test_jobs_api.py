"""Jobs over REST: validation with reasons, per-user access, plans whose TF_CONFIGs TensorFlow itself accepts."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from orchestrator.models import Host, Job, Script
from tests import factories

pytestmark = pytest.mark.django_db

SCRIPT = b"import tensorflow as tf\nprint('hello')\n"


@pytest.fixture
def three_hosts():
    hosts = [factories.host(f"node-{i}", port_min=26000 + 100 * i)[0] for i in range(3)]
    Host.objects.update(status="online", cpu_count=2)
    return hosts


def as_user(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def job_form(**overrides):
    data = {
        "name": "mnist",
        "strategy": "multi_worker_mirrored",
        "workers": 2,
        "devices_per_worker": 1,
        "args": "--epochs 3 --out 'my dir'",
        "script": SimpleUploadedFile("train.py", SCRIPT),
    }
    data.update(overrides)
    return data


def test_it_creates_a_queued_job_with_a_content_addressed_script(alice, three_hosts):
    body = as_user(alice).post("/api/jobs/", job_form(), format="multipart").json()

    job = Job.objects.get(pk=body["id"])
    assert body["state"] == "queued"
    assert body["owner"] == "alice"
    assert job.args == ["--epochs", "3", "--out", "my dir"]
    assert bytes(job.script.content) == SCRIPT
    assert body["script_sha256"] == job.script.sha256
    # The same content uploaded again is stored once.
    as_user(alice).post("/api/jobs/", job_form(name="again"), format="multipart")
    assert Script.objects.count() == 1


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"strategy": "parameter_server", "workers": 2, "ps": 0}, "ps", "parameter_server needs at least 1 ps"),
        ({"strategy": "mirrored", "workers": 2}, "workers", "mirrored runs exactly 1 worker"),
        ({"devices_per_worker": 3}, "non_field_errors", "needs 3 devices on one host; the largest host has 2"),
        ({"workers": 9}, "non_field_errors", "can never run on cluster lab"),
        ({"script": SimpleUploadedFile("train.py", b"def broken(:\n")}, "script", "Syntax error in train.py line 1"),
        ({"script": SimpleUploadedFile("train.sh", b"echo hi\n")}, "script", "train.sh is not a Python file"),
        ({"script": None}, "script", "Upload the training script"),
        ({"args": "--out 'unclosed"}, "args", "Cannot split the arguments"),
        ({"strategy": "horovod"}, "strategy", "is not a valid choice"),
    ],
)
def test_it_refuses_a_bad_job_with_the_reason_and_creates_nothing(alice, three_hosts, overrides, field, message):
    data = {k: v for k, v in job_form(**overrides).items() if v is not None}

    response = as_user(alice).post("/api/jobs/", data, format="multipart")

    assert response.status_code == 400, response.content
    assert message in " ".join(response.json()[field])
    assert not Job.objects.exists()


def test_users_see_only_their_own_jobs_and_staff_see_all(alice, bob, admin_user, three_hosts):
    mine = as_user(alice).post("/api/jobs/", job_form(), format="multipart").json()["id"]

    assert as_user(bob).get(f"/api/jobs/{mine}/").status_code == 404
    assert as_user(bob).post(f"/api/jobs/{mine}/cancel/").status_code == 404
    assert as_user(bob).get(f"/api/jobs/{mine}/tasks/").status_code == 404
    assert as_user(bob).get("/api/jobs/").json()["results"] == []
    assert [j["id"] for j in as_user(admin_user).get("/api/jobs/").json()["results"]] == [mine]
    assert APIClient().get("/api/jobs/").status_code == 401


def test_cancelling_a_queued_job_ends_it_and_a_second_cancel_says_so(alice, three_hosts):
    client = as_user(alice)
    job_id = client.post("/api/jobs/", job_form(), format="multipart").json()["id"]

    first = client.post(f"/api/jobs/{job_id}/cancel/")
    second = client.post(f"/api/jobs/{job_id}/cancel/")

    assert first.json()["state"] == "cancelled"
    assert first.json()["reason"] == "cancelled by alice"
    assert second.status_code == 409


def test_the_plan_gives_every_task_a_tf_config_tensorflow_accepts(alice, three_hosts, monkeypatch):
    tf = pytest.importorskip("tensorflow")
    data = {"name": "ps", "strategy": "parameter_server", "workers": 3, "ps": 2, "devices_per_worker": 1}

    plan = as_user(alice).post("/api/jobs/plan/", data, format="json").json()

    assert plan["fits_now"] is True
    tasks = plan["tasks"]
    assert sorted((t["type"], t["index"]) for t in tasks) == [
        ("chief", 0), ("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1), ("worker", 2),
    ]  # fmt: skip
    assert len({t["host"] for t in tasks}) == 3
    endpoints = [f"{t['address']}:{t['port']}" for t in tasks]
    assert len(set(endpoints)) == len(endpoints)
    clusters = {json.dumps(t["tf_config"]["cluster"], sort_keys=True) for t in tasks}
    assert len(clusters) == 1
    for task in tasks:
        monkeypatch.setenv("TF_CONFIG", json.dumps(task["tf_config"]))
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        assert (resolver.task_type, resolver.task_id) == (task["type"], task["index"])
        spec = resolver.cluster_spec().as_dict()
        assert spec["worker"] == task["tf_config"]["cluster"]["worker"]
        assert len(spec["ps"]) == 2 and len(spec["chief"]) == 1
    for role, count in (("chief", 1), ("worker", 3), ("ps", 2)):
        assert sorted(t["index"] for t in tasks if t["type"] == role) == list(range(count))
    assert not Job.objects.exists()  # planning launches nothing


def test_the_plan_says_why_a_job_does_not_fit_now(alice, three_hosts):
    Host.objects.update(status="offline")
    data = {"name": "mw", "strategy": "multi_worker_mirrored", "workers": 2, "devices_per_worker": 1}

    plan = as_user(alice).post("/api/jobs/plan/", data, format="json").json()

    assert plan["fits_now"] is False
    assert "offline" in plan["reason"]
    assert len(plan["tasks"]) == 2  # where it would run on the idle cluster
