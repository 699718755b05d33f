"""`manage.py submit`: the terminal route to the same validation and planning."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from orchestrator.models import Host, Job
from tests import factories

pytestmark = pytest.mark.django_db

PROGRAMS = "tests/programs"


@pytest.fixture
def setup(django_user_model):
    django_user_model.objects.create_user("alice", password="pw-alice-123")
    for i in range(2):
        factories.host(f"node-{i}", port_min=26000 + 100 * i)
    Host.objects.update(status="online", cpu_count=2)


def test_it_prints_a_plan_and_launches_nothing(setup):
    out = StringIO()

    call_command("submit", f"{PROGRAMS}/mwms_fit.py", "--owner", "alice", "--workers", "2", "--plan", stdout=out)

    plan = json.loads(out.getvalue())
    assert plan["fits_now"] is True
    assert [t["tf_config"]["task"] for t in plan["tasks"]] == [
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]
    assert not Job.objects.exists()


def test_it_queues_a_job(setup):
    out = StringIO()

    call_command("submit", f"{PROGRAMS}/mwms_fit.py", "--owner", "alice", "--args", "--epochs 1", stdout=out)

    job = Job.objects.get()
    assert out.getvalue().strip() == f"job {job.pk} queued on cluster lab"
    assert job.args == ["--epochs", "1"]


def test_it_refuses_a_bad_job_with_the_reason(setup):
    with pytest.raises(CommandError, match="ps: parameter_server needs at least 1 ps"):
        call_command("submit", f"{PROGRAMS}/ps_coordinator.py", "--owner", "alice", "--strategy", "parameter_server")
    assert not Job.objects.exists()
