"""The bad inputs a client can send to the REST API, and what each gets: always a 4xx that says what is wrong, never
a 500, never another user's data. docs/security/fuzzing.md shows this table; a row changed here should change there."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from orchestrator.models import Host, Job, JobArtifact, MetricPoint, Script, Task, TaskLogLine
from tests import factories

pytestmark = pytest.mark.django_db

SCRIPT = b"print('hello')\n"
MIB = 1024 * 1024


@dataclass(frozen=True)
class Row:
    label: str  # the input, as the docs table names it
    method: str
    path: str  # {job}, {task}, {cluster} are filled in with the ids of alice's job, its task and the cluster
    body: Any = None
    format: str = "json"  # json | multipart | raw JSON text
    status: int = 400
    says: str = ""  # a part of the response body
    who: str = "alice"


def script(name: str = "train.py", content: bytes = SCRIPT) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content, content_type="text/x-python")


def job(**overrides: Any) -> dict[str, Any]:
    return {"name": "fuzz", "strategy": "multi_worker_mirrored", "workers": 1, "builtin": "", **overrides}


def upload(**overrides: Any) -> dict[str, Any]:
    return {"name": "fuzz", "strategy": "multi_worker_mirrored", "workers": "1", "script": script(), **overrides}


ROWS = [
    # Malformed bodies
    Row("malformed JSON body", "POST", "/api/jobs/", '{"name": "x",', format="raw", says="JSON parse error"),
    Row(
        "a JSON list instead of an object",
        "POST",
        "/api/jobs/",
        [1, 2],
        says="Invalid data. Expected a dictionary, but got list.",
    ),
    Row("an empty JSON object", "POST", "/api/jobs/", {}, says="This field is required."),
    # Huge values
    Row(
        "workers = 10**12",
        "POST",
        "/api/jobs/",
        job(workers=10**12),
        says="Ensure this value is less than or equal to 256.",
    ),
    Row(
        "workers = 10**30 (past 64 bits)",
        "POST",
        "/api/jobs/plan/",
        job(workers=10**30),
        says="Ensure this value is less than or equal to 256.",
    ),
    Row(
        "startup_deadline_s = -1",
        "POST",
        "/api/jobs/",
        job(startup_deadline_s=-1),
        says="Ensure this value is greater than or equal to 10.",
    ),
    Row(
        "args as a list of 10,000 strings",
        "POST",
        "/api/jobs/",
        job(args=["--x"] * 10_000),
        says="Arguments are limited to 4000 characters.",
    ),
    Row(
        "metrics ?since=10**30", "GET", "/api/jobs/{job}/metrics/?since=" + str(10**30), status=200, says='"points":[]'
    ),
    Row("tasks ?attempt=10**30", "GET", "/api/jobs/{job}/tasks/?attempt=" + str(10**30), status=200, says="[]"),
    Row(
        "tasks ?attempt=² (a digit int() refuses)",
        "GET",
        "/api/jobs/{job}/tasks/?attempt=%C2%B2",
        says="is not an attempt number (or 'all').",
    ),
    Row(
        "log lines ?since=² (a digit int() refuses)",
        "GET",
        "/api/jobs/{job}/logs/{task}/lines/?since=%C2%B2",
        says="is not a line number.",
    ),
    Row(
        "env naming a reserved variable",
        "POST",
        "/api/jobs/",
        job(builtin="digits_mlp", env={"LD_PRELOAD": "/tmp/x.so"}),
        says="LD_PRELOAD is reserved",
    ),
    Row("env = [1]", "POST", "/api/jobs/", job(builtin="digits_mlp", env=[1]), says="Give a JSON object."),
    Row("job id 10**30", "GET", f"/api/jobs/{10**30}/", status=404, says="No Job matches the given query."),
    Row(
        "host port_min = 10**12 (staff)",
        "POST",
        "/api/clusters/{cluster}/hosts/",
        {"name": "n1", "address": "10.0.0.1", "port_min": 10**12, "port_max": 10**12 + 5},
        who="staff",
        says="Ensure this value is less than or equal to",
    ),
    # Wrong types
    Row('workers = "many"', "POST", "/api/jobs/", job(workers="many"), says="A valid integer is required."),
    Row("workers = 1.5", "POST", "/api/jobs/", job(workers=1.5), says="A valid integer is required."),
    Row('name = ["a"]', "POST", "/api/jobs/", job(name=["a"]), says="Not a valid string."),
    Row("name with a NUL character", "POST", "/api/jobs/", job(name="a\x00b"), says="Null characters are not allowed."),
    Row(
        "builtin_config = [1]",
        "POST",
        "/api/jobs/",
        job(builtin="digits_mlp", builtin_config=[1]),
        says="Give a JSON object.",
    ),
    Row('args = {"a": 1}', "POST", "/api/jobs/", job(args={"a": 1}), says="Give a list of strings or one string."),
    Row(
        'cluster = "abc"',
        "POST",
        "/api/jobs/",
        job(cluster="abc"),
        says="Incorrect type. Expected pk value, received str.",
    ),
    Row("cluster = 999999", "POST", "/api/jobs/", job(cluster=999999), says='Invalid pk \\"999999\\"'),
    Row('strategy = "horovod"', "POST", "/api/jobs/", job(strategy="horovod"), says="is not a valid choice."),
    Row("metrics ?since=abc", "GET", "/api/jobs/{job}/metrics/?since=abc", says="since and task are integers."),
    Row('job id "abc"', "GET", "/api/jobs/abc/", status=404, says="Not found."),
    Row('job id "0.5"', "POST", "/api/jobs/0.5/cancel/", status=404, says="Not found."),
    Row(
        "non-staff creates a cluster",
        "POST",
        "/api/clusters/",
        {"name": "mine"},
        status=403,
        says="Only staff may register or change clusters and hosts.",
    ),
    Row(
        "staff deletes a cluster that has jobs",
        "DELETE",
        "/api/clusters/{cluster}/",
        who="staff",
        status=409,
        says="has jobs; it cannot be deleted",
    ),
    # Another user's ids: bob asks for alice's job and its parts
    *[
        Row(f"bob: {method} {path}", method, path, who="bob", status=404, says="No Job matches the given query.")
        for method, path in [
            ("GET", "/api/jobs/{job}/"),
            ("GET", "/api/jobs/{job}/tasks/"),
            ("GET", "/api/jobs/{job}/logs/{task}/"),
            ("GET", "/api/jobs/{job}/logs/{task}/lines/"),
            ("GET", "/api/jobs/{job}/metrics/"),
            ("GET", "/api/jobs/{job}/metrics-csv/"),
            ("GET", "/api/jobs/{job}/artifacts/"),
            ("GET", "/api/jobs/{job}/artifacts/model.keras/"),
            ("POST", "/api/jobs/{job}/cancel/"),
        ]
    ],
    # Uploads
    Row(
        "script of 1 MiB + 1 byte",
        "POST",
        "/api/jobs/",
        upload(script=script(content=b"#" * (MIB + 1))),
        format="multipart",
        says="The script is 1,048,577 bytes; the limit is 1,048,576 bytes (TFDASH_MAX_SCRIPT_BYTES).",
    ),
    Row(
        "script of 5 MiB",
        "POST",
        "/api/jobs/",
        upload(script=script(content=b"#" * (5 * MIB))),
        format="multipart",
        says="The script is 5,242,880 bytes; the limit is 1,048,576 bytes (TFDASH_MAX_SCRIPT_BYTES).",
    ),
    Row(
        "notes.txt instead of a .py",
        "POST",
        "/api/jobs/",
        upload(script=script("notes.txt")),
        format="multipart",
        says="notes.txt is not a Python file (.py).",
    ),
    Row(
        "a PNG named train.py",
        "POST",
        "/api/jobs/",
        upload(script=script(content=b"\x89PNG\r\n\x1a\n\xff\xfe")),
        format="multipart",
        says="The script is not UTF-8 text.",
    ),
    Row(
        "a .py with a NUL byte",
        "POST",
        "/api/jobs/",
        upload(script=script(content=b"x = 1\x00\n")),
        format="multipart",
        says="Syntax error in train.py: source code string cannot contain null bytes.",
    ),
    Row(
        "a .py that does not compile",
        "POST",
        "/api/jobs/",
        upload(script=script(content=b"def broken(:\n")),
        format="multipart",
        says="Syntax error in train.py line 1",
    ),
    Row(
        "a .py nested too deeply to compile (x=-----...1, 200,000 signs)",
        "POST",
        "/api/jobs/",
        upload(script=script(content=b"x=" + b"-" * 200_000 + b"1\n")),
        format="multipart",
        says="train.py is nested too deeply to compile.",
    ),
    Row(
        "builtin_config as text that is not JSON",
        "POST",
        "/api/jobs/",
        upload(builtin="digits_mlp", builtin_config="{oops", script=None),
        format="multipart",
        says="Not JSON",
    ),
]


@pytest.fixture
def world(alice, bob, django_user_model) -> dict[str, Any]:
    staff = django_user_model.objects.create_user("sam", password="pw-sam-123", is_staff=True)
    hosts = [factories.host(f"node-{i}", port_min=26000 + 100 * i)[0] for i in range(2)]
    Host.objects.update(status="online", cpu_count=2)
    the_job = Job.objects.create(
        owner=alice, cluster=hosts[0].cluster, name="j", strategy="multi_worker_mirrored", program_kind="script",
        attempt=1,
    )  # fmt: skip
    task = Task.objects.create(job=the_job, attempt=1, type="worker", index=0, host=hosts[0], port=26000)
    TaskLogLine.objects.create(task=task, seq=1, stream="stdout", text="alice's secret log line")
    MetricPoint.objects.create(job=the_job, task=task, phase="train", name="loss", step=1, value=0.5, ts=1.0)
    JobArtifact.objects.create(job=the_job, task=task, name="model.keras", sha256="0" * 64, size=1, content=b"m")
    return {
        "users": {"alice": alice, "bob": bob, "staff": staff},
        "ids": {"job": the_job.pk, "task": task.pk, "cluster": hosts[0].cluster_id},
    }


def send(world: dict[str, Any], row: Row) -> Any:
    client = APIClient()
    client.force_authenticate(world["users"][row.who])
    path = row.path.format(**world["ids"])
    call = getattr(client, row.method.lower())
    if row.body is None:
        return call(path)
    if row.format == "raw":
        return call(path, row.body, content_type="application/json")
    body = {k: v for k, v in row.body.items() if v is not None} if isinstance(row.body, dict) else row.body
    return call(path, body, format=row.format)


@pytest.mark.parametrize("row", ROWS, ids=[row.label for row in ROWS])
def test_each_bad_input_gets_a_clear_client_error(world, row):
    jobs_before = Job.objects.count()

    response = send(world, row)

    text = response.content.decode()
    assert response.status_code == row.status, text
    assert row.says in text, text
    assert "secret" not in text
    if row.method == "POST" and row.path.startswith("/api/jobs/"):
        assert Job.objects.count() == jobs_before  # nothing created by a refused request


def test_a_path_like_file_name_is_only_a_label_the_script_is_stored_by_content(world, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    content = b"print('mine')\n"
    data = upload(script=script("../../etc/passwd.py", content), builtin=None)
    data = {k: v for k, v in data.items() if v is not None}

    response = send(world, Row("", "POST", "/api/jobs/", data, format="multipart"))

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["script_sha256"] == hashlib.sha256(content).hexdigest()
    # Django's upload parser keeps only the base name; it is shown, never used as a path.
    assert body["script_name"] == "passwd.py"
    assert bytes(Script.objects.get(pk=body["script_sha256"]).content) == content
    assert list(tmp_path.iterdir()) == []
    assert Path("/etc/passwd").read_bytes() != content


def test_the_table_in_the_docs_lists_every_row():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "security" / "fuzzing.md").read_text()
    for row in ROWS:
        assert row.label in doc, row.label
