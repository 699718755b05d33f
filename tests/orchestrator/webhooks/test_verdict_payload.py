"""A failed or timed-out job's webhook carries its verdict (issue 45): `job.diagnosis` in the body is the dict the
API's job detail gives, and the Slack text says why. The job's end (the events an agent would send, applied as the
lifecycle does) makes the verdict after it commits; a change whose verdict is not on the row yet waits in the outbox
for it, at most VERDICT_WAIT_S, then goes without. Other changes carry {} and never wait."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from contracts.task_messages import TaskEventKind
from orchestrator.diagnosis import store
from orchestrator.models import Job, JobStateChange, Webhook, WebhookDelivery
from orchestrator.webhooks import outbox
from tests import factories
from tests.orchestrator.diagnosis.test_store import TRACEBACK, say
from tests.orchestrator.jobs.test_restarts import apply, running_job, task_of

pytestmark = pytest.mark.django_db(transaction=True)

DIAGNOSIS = {"kind": "time_limit", "title": "the job reached its time limit", "message": "It ran 60 s.",
             "hint": "Raise time_limit_s.", "task": "", "task_id": None, "evidence": [], "peers": [],
             "at": "2026-11-27T23:00:00+00:00"}  # fmt: skip


def hook(owner, events: list[str]) -> Webhook:  # type: ignore[no-untyped-def]
    # A row: registering resolves the URL's name, and this machine resolves no public one.
    return Webhook.objects.create(owner=owner, url="https://hooks.example.com/x", events=events)


def bodies() -> dict[str, dict]:
    return {d.event: json.loads(bytes(d.body)) for d in WebhookDelivery.objects.all()}


def test_a_failed_jobs_post_carries_the_verdict_the_api_gives(alice):
    hook(alice, ["failed"])
    job = running_job(alice, max_restarts=0)
    cause = task_of(job, "worker", 1)
    say(cause, TRACEBACK)

    apply(cause, TaskEventKind.EXITED, exit_code=1)  # the job fails; its verdict is made once that commits
    outbox.fan_out()

    body = bodies()["job.failed"]
    client = APIClient()
    client.force_authenticate(alice)
    assert body["job"]["diagnosis"] == client.get(f"/api/jobs/{job.pk}/").json()["diagnosis"]
    assert (body["job"]["diagnosis"]["kind"], body["job"]["diagnosis"]["task_id"]) == ("user_exception", cause.pk)
    assert f" — why: {body['job']['diagnosis']['title']} (" in body["text"]


def test_a_change_waits_for_its_verdict_then_goes_without_it_past_the_bound(alice):
    hook(alice, ["timed_out", "failed"])
    lab = factories.cluster()
    job = Job.objects.create(owner=alice, cluster=lab, name="j", strategy="mirrored", program_kind="script",
                             state="running", attempt=1)  # fmt: skip
    Job.objects.filter(pk=job.pk).update(state="timed_out")  # the trigger writes the change; no verdict yet

    assert outbox.fan_out() == 0 and JobStateChange.objects.count() == 1  # held back for its verdict
    Job.objects.filter(pk=job.pk).update(diagnosis=DIAGNOSIS)
    assert outbox.fan_out() == 1 and not JobStateChange.objects.exists()
    assert bodies()["job.timed_out"]["job"]["diagnosis"] == DIAGNOSIS

    other = Job.objects.create(owner=alice, cluster=lab, name="k", strategy="mirrored", program_kind="script",
                               state="running", attempt=1)  # fmt: skip
    Job.objects.filter(pk=other.pk).update(state="failed")
    failed = JobStateChange.objects.get(state="failed")
    JobStateChange.objects.filter(pk=failed.pk).update(at=failed.at - timedelta(seconds=outbox.VERDICT_WAIT_S + 1))
    assert outbox.fan_out() == 1  # waited long enough: sent without one
    assert bodies()["job.failed"]["job"]["diagnosis"] == {} and "why:" not in bodies()["job.failed"]["text"]


def test_other_changes_carry_none_and_do_not_wait(alice):
    hook(alice, ["running", "succeeded"])
    job = Job.objects.create(owner=alice, cluster=factories.cluster(), name="j", strategy="mirrored",
                             program_kind="script", state="starting", attempt=1, diagnosis=DIAGNOSIS)  # fmt: skip

    Job.objects.filter(pk=job.pk).update(state="running")
    Job.objects.filter(pk=job.pk).update(state="succeeded")

    assert outbox.fan_out() == 2
    assert [b["job"]["diagnosis"] for b in bodies().values()] == [{}, {}]


def test_the_outbox_waits_for_the_states_the_diagnosis_store_makes_verdicts_for():
    assert set(outbox.DIAGNOSED_STATES) == set(store.DIAGNOSED_STATES)
