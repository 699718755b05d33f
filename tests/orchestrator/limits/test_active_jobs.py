"""Queued + running jobs per user: a submission past TFDASH_MAX_ACTIVE_JOBS_PER_USER is refused with a message in the
browser, the REST API and the `submit` command, staff included; jobs already stored are untouched."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.test import override_settings
from rest_framework.test import APIClient

from orchestrator.models import Host, Job, JobState
from tests import factories

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("online_hosts")]

SCRIPT = b"print('hello')\n"
MESSAGE = (
    "You already have 2 queued or running jobs; the limit is 2 per user (TFDASH_MAX_ACTIVE_JOBS_PER_USER). "
    "Wait for one to end or cancel one, then submit again."
)


@pytest.fixture
def online_hosts() -> list[Host]:
    hosts = [factories.host(f"node-{i}", port_min=26000 + 100 * i)[0] for i in range(2)]
    Host.objects.update(status="online", cpu_count=2)
    return hosts


def jobs_of(owner: Any, *states: str) -> list[Job]:
    """Stored jobs of `owner` in `states`, as earlier submissions left them."""
    cluster = factories.cluster()
    return [
        Job.objects.create(owner=owner, cluster=cluster, name=f"j{i}", strategy="mirrored", program_kind="builtin",
                           builtin="synthetic", state=state)
        for i, state in enumerate(states)
    ]  # fmt: skip


def api_submit(user: Any) -> Any:
    client = APIClient()
    client.force_authenticate(user)
    data = {"name": "one more", "strategy": "mirrored", "script": SimpleUploadedFile("train.py", SCRIPT)}
    return client.post("/api/jobs/", data, format="multipart")


@override_settings(TFDASH_MAX_ACTIVE_JOBS_PER_USER=2)
def test_the_api_refuses_a_job_past_the_limit_with_a_400_and_keeps_the_others(alice):
    before = jobs_of(alice, JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED)

    response = api_submit(alice)

    assert response.status_code == 400
    assert response.json() == {"non_field_errors": [MESSAGE]}
    assert sorted(Job.objects.values_list("pk", "state")) == sorted((j.pk, j.state) for j in before)


@override_settings(TFDASH_MAX_ACTIVE_JOBS_PER_USER=2)
def test_ended_jobs_and_other_users_jobs_do_not_count(alice, bob):
    jobs_of(alice, JobState.QUEUED, JobState.SUCCEEDED, JobState.CANCELLED)
    jobs_of(bob, JobState.QUEUED, JobState.RUNNING)

    assert api_submit(alice).status_code == 201
    assert api_submit(alice).status_code == 400  # now two of alice's are active


@override_settings(TFDASH_MAX_ACTIVE_JOBS_PER_USER=2)
def test_staff_are_held_to_the_limit_too(django_user_model):
    admin = django_user_model.objects.create_user("root", password="pw-root-123", is_staff=True, is_superuser=True)
    jobs_of(admin, JobState.STARTING, JobState.RESTARTING)

    response = api_submit(admin)

    assert response.status_code == 400
    assert response.json()["non_field_errors"] == [MESSAGE]


@override_settings(TFDASH_MAX_ACTIVE_JOBS_PER_USER=2)
def test_the_form_shows_the_limit_and_saves_nothing_new(client, alice, online_hosts):
    before = jobs_of(alice, JobState.QUEUED, JobState.RUNNING)
    client.force_login(alice)
    data = {"name": "mw", "cluster": str(online_hosts[0].cluster_id), "strategy": "mirrored", "workers": "1",
            "ps": "0", "devices_per_worker": "1", "max_restarts": "0", "startup_deadline_s": "120",
            "script": SimpleUploadedFile("train.py", SCRIPT)}  # fmt: skip

    response = client.post("/jobs/new/", data)

    assert response.status_code == 200  # the form again, not a redirect to a new job
    assert MESSAGE in response.content.decode().replace("&#x27;", "'")
    assert list(Job.objects.order_by("pk").values_list("pk", flat=True)) == [j.pk for j in before]


@override_settings(TFDASH_MAX_ACTIVE_JOBS_PER_USER=2)
def test_the_submit_command_refuses_with_the_message(alice):
    before = jobs_of(alice, JobState.QUEUED, JobState.QUEUED)

    with pytest.raises(CommandError) as refused:
        call_command("submit", "tests/programs/mwms_fit.py", "--owner", "alice", "--strategy", "mirrored")

    assert str(refused.value) == MESSAGE
    assert Job.objects.count() == len(before)
