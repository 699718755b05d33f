"""Priority classes by right (issue 42): a user who may not use `high` is refused at the form, the API (jobs, plans,
experiments) and "run again", with the reason on the priority field and nothing stored; staff grant a class per user
or per group in the admin; staff lifting a job past its owner's right is in the job's history; the queue page and
API show each class's rule; migrating existing classes closes those above the default and keeps the rest open.
The CLI's refusal is tests/client/test_cli_e2e.py::test_cli_says_why_a_priority_class_is_refused."""

from __future__ import annotations

import html
import importlib
import re
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import Group
from django.db import connection
from rest_framework.test import APIClient

from orchestrator.experiments import actions as experiments
from orchestrator.models import Experiment, Host, Job, JobEvent, PriorityClass
from orchestrator.scheduler import queue_view, queueing
from tests import factories

pytestmark = pytest.mark.django_db

JOB = {"name": "n", "strategy": "mirrored", "workers": 1, "devices_per_worker": 1, "builtin": "digits_mlp"}
REASON = "Priority class 'high' is not open to you: staff grant it to users and groups"


@pytest.fixture
def lab() -> Host:
    host, _ = factories.host("lab-0")
    Host.objects.filter(pk=host.pk).update(status="online", cpu_slots=2, cpu_count=2)
    queueing.standard_classes_if_none()
    return host


def as_user(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def high() -> PriorityClass:
    return PriorityClass.objects.get(name="high")


def experiment_at_high(name: str) -> dict[str, Any]:
    """An experiment of two variants of digits_mlp at priority `high`, named `name`."""
    return {
        "name": name,
        "builtin": "digits_mlp",
        "builtin_config": {"epochs": 1},
        "variants": [
            {"strategy": "mirrored", "workers": 1, "ps": 0, "devices_per_worker": 1},
            {"strategy": "mirrored", "workers": 1, "ps": 0, "devices_per_worker": 2},
        ],
        "priority": "high",
    }


def test_the_api_refuses_high_to_a_user_without_the_right_with_the_reason_and_stores_nothing(alice, lab):
    refused = as_user(alice).post("/api/jobs/", {**JOB, "priority": "high"}, format="json")
    plan = as_user(alice).post("/api/jobs/plan/", {**JOB, "priority": "high"}, format="json")

    assert refused.status_code == 400, refused.content
    message = " ".join(refused.json()["priority"])
    assert REASON in message and "Classes you may use: normal, low." in message
    assert plan.status_code == 400 and REASON in " ".join(plan.json()["priority"])
    assert not Job.objects.exists()
    # What was always hers stays hers: the default (naming no class), and `low`, which gives nobody an advantage.
    assert as_user(alice).post("/api/jobs/", JOB, format="json").json()["priority"] == "normal"
    assert as_user(alice).post("/api/jobs/", {**JOB, "priority": "low"}, format="json").json()["priority"] == "low"


def test_staff_grant_high_in_the_admin_per_user_and_per_group(alice, bob, admin_client, lab):
    leads = Group.objects.create(name="ml-leads")
    bob.groups.add(leads)
    cls = high()
    form = {
        "name": cls.name,
        "value": cls.value,
        "description": cls.description,
        "min_run_s": cls.min_run_s,
        "max_preemptions": cls.max_preemptions,
        "preemption_window_s": cls.preemption_window_s,
        "users": [str(alice.pk)],
        "groups": [str(leads.pk)],
    }

    saved = admin_client.post(f"/admin/orchestrator/priorityclass/{cls.pk}/change/", form)

    assert saved.status_code == 302, saved.content.decode()[:2000]
    listing = admin_client.get("/admin/orchestrator/priorityclass/").content.decode()
    assert "user alice, group ml-leads, staff" in html.unescape(listing)
    for user in (alice, bob):  # alice by name, bob as a member of ml-leads
        response = as_user(user).post("/api/jobs/", {**JOB, "priority": "high"}, format="json")
        assert response.status_code == 201, response.content
        assert response.json()["priority"] == "high"
    carol = type(alice).objects.create_user("carol", password="x")
    assert as_user(carol).post("/api/jobs/", {**JOB, "priority": "high"}, format="json").status_code == 400


def test_staff_may_use_every_class(admin_user, lab):
    response = as_user(admin_user).post("/api/jobs/", {**JOB, "priority": "high"}, format="json")

    assert response.status_code == 201 and response.json()["priority"] == "high"


def test_the_form_refuses_high_next_to_the_priority_field_and_saves_nothing(client, alice, lab):
    client.force_login(alice)
    data = {
        "name": "mine",
        "cluster": str(lab.cluster_id),
        "strategy": "mirrored",
        "workers": "1",
        "ps": "0",
        "devices_per_worker": "1",
        "max_restarts": "0",
        "startup_deadline_s": "120",
        "builtin": "digits_mlp",
        "priority": "high",
    }

    hint = re.search(r'id="hint-priority"[^>]*>(.*?)<', client.get("/jobs/new/").content.decode(), re.S)
    page = client.post("/jobs/new/", data).content.decode()

    slot = re.search(r'<div (?:class="[^"]*" )?id="errors-priority"[^>]*>(.*?)</div>\s', page, re.S)
    assert slot and REASON in html.unescape(slot.group(1))
    assert not Job.objects.exists()
    assert hint and html.unescape(hint.group(1)).strip().endswith("Yours: normal, low")  # said before she submits


def test_run_again_of_a_job_staff_lifted_to_high_is_refused_to_its_owner(client, alice, admin_user, lab):
    first = as_user(alice).post("/api/jobs/", JOB, format="json").json()["id"]
    queue_view.set_priority(first, "high", by=admin_user.get_username())
    client.force_login(alice)
    form = client.get(f"/jobs/new/?from={first}").content.decode()
    assert re.search(r'name="priority"[^>]*value="high"', form)  # the copy names the class it ran at

    page = client.post(
        f"/jobs/new/?from={first}",
        {"name": "again", "cluster": str(lab.cluster_id), "strategy": "mirrored", "workers": "1", "ps": "0",
         "devices_per_worker": "1", "max_restarts": "0", "startup_deadline_s": "120", "builtin": "digits_mlp",
         "priority": "high"},
    ).content.decode()  # fmt: skip

    assert REASON in html.unescape(page)
    assert Job.objects.count() == 1


def test_an_experiment_naming_high_is_refused_without_the_right(alice, lab):
    body = experiment_at_high("which is faster")

    response = as_user(alice).post("/api/experiments/", body, format="json")

    assert response.status_code == 400, response.content
    assert REASON in " ".join(response.json()["priority"])
    assert not Experiment.objects.exists() and not Job.objects.exists()


def test_an_experiment_at_high_runs_at_high_while_its_owner_may_and_not_after(alice, lab):
    high().users.add(alice)
    body = experiment_at_high("at high")

    created = as_user(alice).post("/api/experiments/", body, format="json")

    assert created.status_code == 201, created.content
    first = Job.objects.get()
    assert first.priority == "high"
    high().users.remove(alice)  # staff withdraw the right before the second run (one after another) is submitted
    Job.objects.filter(pk=first.pk).update(state="succeeded")
    experiments.advance(created.json()["id"])
    second = Job.objects.exclude(pk=first.pk).get()
    assert second.state == "failed" and REASON in second.reason


def test_staff_lifting_a_job_past_its_owners_right_is_in_its_history(alice, admin_user, lab):
    job_id = as_user(alice).post("/api/jobs/", JOB, format="json").json()["id"]
    staff = as_user(admin_user)

    assert staff.post(f"/api/jobs/{job_id}/priority/", {"priority": "high"}, format="json").status_code == 200
    high().users.add(alice)
    staff.post(f"/api/jobs/{job_id}/priority/", {"priority": "low"}, format="json")
    staff.post(f"/api/jobs/{job_id}/priority/", {"priority": "high"}, format="json")

    assert list(JobEvent.objects.filter(job_id=job_id).values_list("text", flat=True)) == [
        "priority normal -> high by admin (beyond alice's own right)",
        "priority high -> low by admin",
        "priority low -> high by admin",  # hers by then
    ]


def test_the_queue_page_and_api_show_each_classs_rule(client, alice, bob, lab):
    leads = Group.objects.create(name="ml-leads")
    high().groups.add(leads)
    high().users.add(bob)
    client.force_login(alice)

    rules = {r["name"]: r for r in as_user(alice).get("/api/priority-classes/").json()}
    page = html.unescape(client.get(f"/clusters/{lab.cluster_id}/queue/").content.decode())

    assert list(rules) == ["high", "normal", "low"]
    assert (rules["high"]["users"], rules["high"]["groups"], rules["high"]["open_to_all"]) == (
        ["bob"],
        ["ml-leads"],
        False,
    )
    assert rules["high"]["who"] == "user bob, group ml-leads, staff" and not rules["high"]["you_may_use"]
    assert rules["normal"]["who"] == "everyone (the default class)" and rules["normal"]["you_may_use"]
    assert rules["low"]["who"] == "everyone" and rules["low"]["you_may_use"]
    row = re.search(r'<tr id="class-high">(.*?)</tr>', page, re.S)
    assert row and "user bob, group ml-leads, staff" in row.group(1) and "may not use" in row.group(1)
    assert as_user(bob).get("/api/priority-classes/").json()[0]["you_may_use"] is True


def test_migrating_closes_existing_classes_above_the_default_and_keeps_the_others_open():
    """Migration 0022 on a fleet whose staff had added classes of their own."""
    PriorityClass.objects.all().delete()
    rows = [("urgent", 500, False), ("normal", 100, True), ("batch", 50, False), ("scavenger", -10, False)]
    for name, value, default in rows:
        PriorityClass.objects.create(name=name, value=value, is_default=default, open_to_all=False)
    migration = importlib.import_module("orchestrator.migrations.0022_priority_class_rights")

    with connection.schema_editor() as editor:  # as `migrate` calls it: on the database being migrated
        migration.open_what_gives_no_advantage(apps, editor)

    opened = dict(PriorityClass.objects.values_list("name", "open_to_all"))
    assert opened == {"urgent": False, "normal": True, "batch": True, "scavenger": True}


def test_a_fresh_fleet_has_high_closed_and_low_and_normal_open():
    """What migrations 0015 and 0022 leave, and what a flushed database gets again (standard_classes_if_none)."""
    migrated = dict(PriorityClass.objects.values_list("name", "open_to_all"))
    PriorityClass.objects.all().delete()
    queueing.standard_classes_if_none()

    assert migrated == {"high": False, "normal": True, "low": True}
    assert dict(PriorityClass.objects.values_list("name", "open_to_all")) == migrated
