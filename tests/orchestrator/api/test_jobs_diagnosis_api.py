"""`diagnosis` over REST (issue 45): a failed job's verdict on its detail (the dict the job page shows) and in the jobs
list (less its evidence lines and peers), {} for a job without one; only its owner and staff see it; and the list
reads it from the row: no query more for a page of diagnosed jobs than for the same page without."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from orchestrator.models import Job, Task, TaskLogLine
from tests import factories

pytestmark = pytest.mark.django_db

DIAGNOSIS = {
    "kind": "missing_import",
    "title": "worker 0 could not import tensorflow_datasets",
    "message": "worker 0 on node-0 raised ModuleNotFoundError: No module named 'tensorflow_datasets' at train.py:3",
    "hint": "Install tensorflow_datasets in the job's environment (requirements) or on every host.",
    "task": "worker 0 on node-0",
    "task_id": 7,
    "evidence": ["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'tensorflow_datasets'"],
    "peers": [{"task": "worker 1 on node-1", "task_id": 8, "kind": "peer_failure", "message": "CancelledError"}],
    "at": "2026-11-27T23:00:00+00:00",
    "lines_in": 0,  # the log lines it was made from: the job has none, so it is not made again
}
LISTED = {key: value for key, value in DIAGNOSIS.items() if key not in ("evidence", "peers")}  # the detail has them


def as_user(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def a_job(owner, **fields) -> Job:
    defaults = {"name": "j", "strategy": "multi_worker_mirrored", "program_kind": "script", "workers": 2}
    return Job.objects.create(owner=owner, cluster=factories.cluster(), **{**defaults, **fields})


def test_a_failed_jobs_detail_and_list_carry_its_diagnosis_and_others_an_empty_one(alice):
    failed = a_job(alice, state="failed", diagnosis=DIAGNOSIS)
    running = a_job(alice, state="running")
    api = as_user(alice)

    assert api.get(f"/api/jobs/{failed.pk}/").json()["diagnosis"] == DIAGNOSIS
    assert api.get(f"/api/jobs/{running.pk}/").json()["diagnosis"] == {}
    listed = {job["id"]: job["diagnosis"] for job in api.get("/api/jobs/").json()["results"]}
    assert listed == {failed.pk: LISTED, running.pk: {}}
    assert [j["id"] for j in api.get("/api/jobs/?state=failed").json()["results"]] == [failed.pk]


def test_only_the_owner_and_staff_see_a_diagnosis(alice, bob, admin_user):
    failed = a_job(alice, state="failed", diagnosis=DIAGNOSIS)

    assert as_user(bob).get(f"/api/jobs/{failed.pk}/").status_code == 404
    assert as_user(bob).get("/api/jobs/").json()["results"] == []
    assert as_user(admin_user).get(f"/api/jobs/{failed.pk}/").json()["diagnosis"] == DIAGNOSIS


def test_the_list_reads_diagnoses_from_the_rows_with_no_query_more(alice):
    jobs = [a_job(alice, state="failed", name=f"j{i}") for i in range(6)]
    api = as_user(alice)

    def list_queries() -> tuple[int, list[dict]]:
        with CaptureQueriesContext(connection) as queries:
            body = api.get("/api/jobs/").json()
        return len(queries.captured_queries), [job["diagnosis"] for job in body["results"]]

    without, shown = list_queries()
    assert shown == [{}] * 6
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(diagnosis=DIAGNOSIS)
    with_diagnoses, shown = list_queries()

    assert shown == [LISTED] * 6
    assert with_diagnoses == without


def test_the_schema_documents_the_diagnosis(alice):
    schema = as_user(alice).get("/api/schema/", HTTP_ACCEPT="application/json").json()

    diagnosis = schema["components"]["schemas"]["Diagnosis"]
    assert {"kind", "title", "message", "hint", "task", "task_id", "evidence", "peers", "at"} <= set(
        diagnosis["properties"]
    )
    assert "diagnosis" in schema["components"]["schemas"]["Job"]["properties"]
    # {} and empty strings (a time limit names no task) conform: the fuzz test checks every response against it.
    assert "required" not in diagnosis and "required" not in schema["components"]["schemas"]["DiagnosisPeer"]
    assert "minLength" not in diagnosis["properties"]["task"]


def test_a_failed_jobs_detail_makes_its_verdict_when_its_end_has_not_yet(alice):
    host, _token = factories.host()
    host.save()
    job = a_job(alice, state="failed", attempt=1)  # on factories.cluster(), the host's
    task = Task.objects.create(job=job, attempt=1, type="worker", index=1, host=host, state="failed", exit_code=1)
    lines = ["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'tensorflow_datasets'"]
    TaskLogLine.objects.bulk_create(TaskLogLine(task=task, seq=i, stream="stderr", text=t) for i, t in enumerate(lines))
    Job.objects.filter(pk=job.pk).update(failed_task=task)
    api = as_user(alice)
    assert api.get("/api/jobs/").json()["results"][0]["diagnosis"] == {}  # the list reads the row alone

    made = api.get(f"/api/jobs/{job.pk}/").json()["diagnosis"]

    assert made["task_id"] == task.pk and "tensorflow_datasets" in made["message"]
    listed = api.get("/api/jobs/").json()["results"][0]["diagnosis"]  # saved on the row
    assert listed == {key: value for key, value in made.items() if key not in ("evidence", "peers")}


def test_a_verdict_that_cannot_be_made_leaves_the_detail_with_the_stored_one(alice, monkeypatch):
    failed = a_job(alice, state="failed", diagnosis=DIAGNOSIS)

    def broken(_job):
        Job.objects.raw("SELECT no_such_column FROM orchestrator_job")[0]  # a database error inside

    monkeypatch.setattr("orchestrator.diagnosis.store.current", broken)
    response = as_user(alice).get(f"/api/jobs/{failed.pk}/")

    assert response.status_code == 200 and response.json()["diagnosis"] == DIAGNOSIS
