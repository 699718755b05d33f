"""Registering task environments: staff's admin page (one default per cluster, said plainly; saving tells the
cluster's agents) and `manage.py local_cluster --environment`, which `make run` uses to make its own venv the local
cluster's default."""

from __future__ import annotations

import html
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from orchestrator.models import Cluster, TaskEnvironment

pytestmark = pytest.mark.django_db

ADD = "/admin/orchestrator/taskenvironment/add/"


@pytest.fixture
def staff_browser() -> Client:
    staff = get_user_model().objects.create_user("staff", password="pw-staff-123", is_staff=True, is_superuser=True)
    browser = Client()
    browser.force_login(staff)
    return browser


def test_staff_register_a_default_then_others_and_hear_what_is_wrong(staff_browser: Client) -> None:
    cluster = Cluster.objects.create(name="lab")
    form = {"cluster": cluster.pk, "name": "tf-2.17", "interpreter": "/opt/envs/tf-2.17/bin/python", "labels": ""}
    page = html.unescape(staff_browser.post(ADD, form).content.decode())
    assert "A cluster's first environment is its default: tick it." in page
    assert staff_browser.post(ADD, {**form, "is_default": "on"}).status_code == 302
    second = {**form, "name": "tf-2.15", "interpreter": "/opt/envs/tf-2.15/bin/python", "is_default": "on"}
    page = html.unescape(staff_browser.post(ADD, second).content.decode())
    assert "tf-2.17 is this cluster's default: untick it there first" in page
    assert staff_browser.post(ADD, {**second, "is_default": ""}).status_code == 302
    bad = {**form, "name": "Bad Name", "interpreter": "python3"}
    page = html.unescape(staff_browser.post(ADD, bad).content.decode())
    assert "lower-case letters" in page and "absolute path" in page
    assert sorted(TaskEnvironment.objects.values_list("name", "is_default")) == [("tf-2.15", False), ("tf-2.17", True)]


def test_make_runs_cluster_gets_its_venv_as_the_default_environment(capsys: pytest.CaptureFixture[str]) -> None:
    venv_python = str(Path(sys.executable).absolute())
    call_command("local_cluster", "--hosts", "1", "--environment", venv_python)
    call_command("local_cluster", "--hosts", "1", "--environment", venv_python)  # again: the same one row
    found = TaskEnvironment.objects.get(cluster__name="local")
    assert (found.name, found.interpreter, found.is_default) == ("local-venv", venv_python, True)
    with pytest.raises(CommandError, match="absolute path"):
        call_command("local_cluster", "--hosts", "1", "--environment", "python3")
    capsys.readouterr()
