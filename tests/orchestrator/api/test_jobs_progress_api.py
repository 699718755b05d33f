"""`progress` over REST (issue 45): a job's epoch k of N, step, examples/s and ETA on its detail and in the jobs list,
as Job.progress holds it ({} before its first epoch); only its owner and staff see it; documented in the schema."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from orchestrator.models import Job
from tests import factories

pytestmark = pytest.mark.django_db

PROGRESS = {"epoch": 3, "epochs": 10, "step": 90, "steps": 300, "examples_per_s": 1234.5, "eta_s": 42.0,
            "resumed_from_epoch": 0, "at": 1_800_000_000.0}  # fmt: skip
# What the API adds: the pages' own words as of the request (measured in the future here: the ETA stands as is).
SAID = {**PROGRESS, "text": "epoch 3/10 · step 90/300 · 1,234 examples/s · ETA 42 s", "short": "epoch 3/10 · ETA 42 s"}


def as_user(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def a_job(owner, **fields) -> Job:
    defaults = {"name": "j", "strategy": "multi_worker_mirrored", "program_kind": "script", "workers": 2}
    return Job.objects.create(owner=owner, cluster=factories.cluster(), **{**defaults, **fields})


def test_the_detail_and_the_list_carry_the_jobs_progress(alice, bob, admin_user):
    running = a_job(alice, state="running", progress=PROGRESS)
    queued = a_job(alice)
    api = as_user(alice)

    assert api.get(f"/api/jobs/{running.pk}/").json()["progress"] == SAID
    assert api.get(f"/api/jobs/{queued.pk}/").json()["progress"] == {}
    listed = {job["id"]: job["progress"] for job in api.get("/api/jobs/").json()["results"]}
    assert listed == {running.pk: SAID, queued.pk: {}}
    assert as_user(bob).get(f"/api/jobs/{running.pk}/").status_code == 404
    assert as_user(admin_user).get(f"/api/jobs/{running.pk}/").json()["progress"] == SAID


def test_the_schema_documents_the_progress(alice):
    schema = as_user(alice).get("/api/schema/", HTTP_ACCEPT="application/json").json()

    progress = schema["components"]["schemas"]["Progress"]
    assert set(progress["properties"]) == set(SAID)
    assert "required" not in progress  # {} conforms: the fuzz test checks every response against the schema
    assert progress["properties"]["eta_s"]["nullable"] is True
    assert "progress" in schema["components"]["schemas"]["Job"]["properties"]
