"""`tfdash submit --priority` as a user without the right to the class has it (issue 42): the real command, installed
on its own, against a live server, says why on the option to change and exits 5 (refused), nothing stored; once staff
grant the class to a group the user is in, the same command queues the job at that class, and `tfdash queue` shows
each class's rule."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from orchestrator.models import Host, Job, PriorityClass
from orchestrator.scheduler import queueing
from tests import factories
from tests.client.test_cli_e2e import PASSWORD, PROGRAMS, laptop, tfdash_bin  # noqa: F401  (fixtures, reused)

pytestmark = pytest.mark.django_db(transaction=True)


def test_cli_says_why_a_priority_class_is_refused(web, alice, laptop):  # noqa: F811
    host, _ = factories.host("only", port_min=27600)
    Host.objects.filter(pk=host.pk).update(status="online", cpu_slots=1, cpu_count=1)
    queueing.standard_classes_if_none()
    assert laptop.run("login", web.url, "-u", "alice", "--password-stdin", stdin=PASSWORD + "\n").returncode == 0
    submit = ("submit", str(PROGRAMS / "exits_3.py"), "--strategy", "mirrored", "--priority", "high")

    refused = laptop.run(*submit)

    assert refused.returncode == 5, (refused.stdout, refused.stderr)
    said = " ".join(refused.stderr.split())  # rich wraps long lines
    assert "--priority: Priority class 'high' is not open to you: staff grant it to users and groups" in said
    assert "Classes you may use: normal, low." in said and "Traceback" not in said
    assert not Job.objects.exists()

    leads = Group.objects.create(name="ml-leads")
    alice.groups.add(leads)
    PriorityClass.objects.get(name="high").groups.add(leads)
    granted = laptop.run(*submit)

    assert granted.returncode == 0, (granted.stdout, granted.stderr)
    assert list(Job.objects.values_list("owner__username", "priority_class__name")) == [("alice", "high")]
    # `tfdash queue` shows each class's rule, as the queue page does.
    queue = laptop.run("queue")
    rules = {line.split()[0]: " ".join(line.split()) for line in queue.stdout.splitlines() if line.strip()}
    assert queue.returncode == 0, queue.stderr
    assert rules["high"] == "high 200 no group ml-leads, staff may use"
    assert rules["normal"] == "normal 100 no everyone (the default class) may use"
