"""An uploaded script is bounded by TFDASH_MAX_SCRIPT_BYTES, with the same message in the form and the API."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings
from rest_framework.test import APIClient

from orchestrator.models import Host, Job, Script
from tests import factories

pytestmark = pytest.mark.django_db

MESSAGE = "The script is 101 bytes; the limit is 100 bytes (TFDASH_MAX_SCRIPT_BYTES)."
TOO_LARGE = b"#" * 100 + b"\n"


@pytest.fixture
def cluster_id() -> int:
    host, _token = factories.host("node-0")
    Host.objects.update(status="online", cpu_count=2)
    return host.cluster_id


@override_settings(TFDASH_MAX_SCRIPT_BYTES=100)
def test_the_api_refuses_a_script_past_the_limit(alice, cluster_id):
    client = APIClient()
    client.force_authenticate(alice)
    data = {"name": "big", "strategy": "mirrored", "script": SimpleUploadedFile("train.py", TOO_LARGE)}

    response = client.post("/api/jobs/", data, format="multipart")

    assert response.status_code == 400
    assert response.json() == {"script": [MESSAGE]}
    assert not Job.objects.exists() and not Script.objects.exists()


@override_settings(TFDASH_MAX_SCRIPT_BYTES=100)
def test_the_form_refuses_a_script_past_the_limit(client, alice, cluster_id):
    client.force_login(alice)
    data = {"name": "big", "cluster": str(cluster_id), "strategy": "mirrored", "workers": "1", "ps": "0",
            "devices_per_worker": "1", "max_restarts": "0", "startup_deadline_s": "120",
            "script": SimpleUploadedFile("train.py", TOO_LARGE)}  # fmt: skip

    response = client.post("/jobs/new/", data)

    assert response.status_code == 200
    assert MESSAGE in response.content.decode()
    assert not Job.objects.exists() and not Script.objects.exists()


@override_settings(TFDASH_MAX_SCRIPT_BYTES=101)
def test_a_script_at_the_limit_is_taken(alice, cluster_id):
    client = APIClient()
    client.force_authenticate(alice)
    data = {"name": "big", "strategy": "mirrored", "script": SimpleUploadedFile("train.py", TOO_LARGE)}

    assert client.post("/api/jobs/", data, format="multipart").status_code == 201
