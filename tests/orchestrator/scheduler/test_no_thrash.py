"""No thrash (issue 46): a job inside its class's minimum run time is never chosen as a victim, and a job preempted as
often as its class bounds within the window is not preempted again until it ends; the page and the API say until
when a running job is protected.

Scheduler passes on real PostgreSQL rows, as in test_queue_policy.py (the agents' part is another test's)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from orchestrator.jobs import lifecycle
from orchestrator.models import Job, JobEvent, JobState, PriorityClass
from orchestrator.scheduler import scheduling
from tests.orchestrator.scheduler.test_queue_policy import job, one_host, running, states, tasks_gone

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def every_pass_plans(monkeypatch):  # type: ignore[no-untyped-def]
    """A pass plans every waiting job (else only every 5 s, and these passes follow each other within that)."""
    monkeypatch.setattr(scheduling, "PLAN_EVERY_S", 0.0)


def placed_ago(j: Job, minutes: float) -> None:
    Job.objects.filter(pk=j.pk).update(state=JobState.RUNNING, placed_at=timezone.now() - timedelta(minutes=minutes))


def test_a_job_inside_its_minimum_run_time_is_never_chosen_even_when_it_is_the_cheapest_victim(alice, bob):
    PriorityClass.objects.filter(name="low").update(min_run_s=600)
    host = one_host(devices=2)
    # The cheapest victim by the usual rule (the least work to redo: 2 minutes against 30) is the one just placed.
    just_started = job(alice, host, "low, placed 2 minutes ago", priority="low")
    long_running = job(alice, host, "low, placed 30 minutes ago", priority="low")
    scheduling.schedule_cluster(host.cluster_id)
    placed_ago(just_started, 2)
    placed_ago(long_running, 30)
    urgent = job(bob, host, "high", priority="high")

    scheduling.schedule_cluster(host.cluster_id)

    assert states(just_started, long_running) == [JobState.RUNNING, JobState.PREEMPTED]
    assert Job.objects.get(pk=urgent.pk).reason.startswith(f"preempting #{long_running.pk}")


def test_a_job_inside_its_minimum_run_time_is_preempted_only_once_it_is_past_it(alice, bob):
    PriorityClass.objects.filter(name="low").update(min_run_s=600)
    host = one_host(devices=1)
    low = job(alice, host, "low", priority="low")
    scheduling.schedule_cluster(host.cluster_id)
    placed_ago(low, 9)
    urgent = job(bob, host, "high", priority="high")

    scheduling.schedule_cluster(host.cluster_id)

    assert states(low, urgent) == [JobState.RUNNING, JobState.QUEUED]
    assert not Job.objects.get(pk=urgent.pk).reason.startswith("preempting")
    placed_ago(low, 11)
    scheduling.schedule_cluster(host.cluster_id)
    assert states(low) == [JobState.PREEMPTED]


def test_a_borrower_reclaimed_by_quota_also_keeps_its_minimum_run_time(alice, bob):
    from orchestrator.models import Quota

    host = one_host(devices=1)
    Quota.objects.create(cluster=host.cluster, user=alice, devices=0)
    Quota.objects.create(cluster=host.cluster, user=bob, devices=1)
    borrowed = job(alice, host, "borrows the idle device")
    scheduling.schedule_cluster(host.cluster_id)
    assert Job.objects.get(pk=borrowed.pk).borrowing
    placed_ago(borrowed, 1)  # the default class's minimum run time is 5 min
    job(bob, host, "bob reclaims his quota")

    scheduling.schedule_cluster(host.cluster_id)
    assert states(borrowed) == [JobState.RUNNING]
    placed_ago(borrowed, 6)
    scheduling.schedule_cluster(host.cluster_id)
    assert states(borrowed) == [JobState.PREEMPTED]


def preempt_and_resume(victim: Job, host, by: Job) -> None:  # type: ignore[no-untyped-def]
    """One round: `by` preempts the victim, runs and ends; the victim is placed again and runs past its minimum."""
    scheduling.schedule_cluster(host.cluster_id)
    assert states(victim) == [JobState.PREEMPTED], Job.objects.get(pk=by.pk).reason
    tasks_gone(victim)
    scheduling.schedule_cluster(host.cluster_id)
    assert states(by) == [JobState.STARTING]
    tasks_gone(by)
    Job.objects.filter(pk=by.pk).update(state=JobState.SUCCEEDED)
    scheduling.schedule_cluster(host.cluster_id)
    assert states(victim) == [JobState.STARTING]
    running(victim)


def test_a_job_preempted_as_often_as_its_class_bounds_is_not_preempted_again_until_it_ends(alice, bob):
    PriorityClass.objects.filter(name="low").update(max_preemptions=2, preemption_window_s=3600)
    host = one_host(devices=1)
    low = job(alice, host, "low, preempted twice", priority="low")
    scheduling.schedule_cluster(host.cluster_id)
    running(low)
    for n in range(2):
        preempt_and_resume(low, host, by=job(bob, host, f"high {n}", priority="high"))
    shielded = Job.objects.get(pk=low.pk)
    assert (shielded.preemptions, shielded.preemption_shielded) == (2, True)
    assert (
        JobEvent.objects.filter(job=low, kind="preempted")
        .last()
        .text.endswith(  # type: ignore[union-attr]
            "preempted 2 times: protected from further preemption until it ends"
        )
    )
    third = job(bob, host, "high 2", priority="high")

    scheduling.schedule_cluster(host.cluster_id)

    assert states(low, third) == [JobState.RUNNING, JobState.QUEUED]
    assert not Job.objects.get(pk=third.pk).reason.startswith("preempting")


def test_preemptions_older_than_the_window_do_not_count_towards_the_bound(alice, bob):
    PriorityClass.objects.filter(name="low").update(max_preemptions=2, preemption_window_s=3600)
    host = one_host(devices=1)
    low = job(alice, host, "low", priority="low")
    scheduling.schedule_cluster(host.cluster_id)
    running(low)
    preempt_and_resume(low, host, by=job(bob, host, "high 0", priority="high"))
    JobEvent.objects.filter(job=low, kind="preempted").update(at=timezone.now() - timedelta(hours=2))

    preempt_and_resume(low, host, by=job(bob, host, "high 1", priority="high"))

    assert Job.objects.get(pk=low.pk).preemption_shielded is False  # one of its two preemptions was 2 h ago
    job(bob, host, "high 2", priority="high")
    scheduling.schedule_cluster(host.cluster_id)
    assert states(low) == [JobState.PREEMPTED]


def test_the_page_and_the_api_say_until_when_a_running_job_is_protected(alice, bob):
    PriorityClass.objects.filter(name="low").update(min_run_s=600)
    host = one_host(devices=2)
    low, normal = job(alice, host, "low", priority="low"), job(alice, host, "normal: never a victim")
    scheduling.schedule_cluster(host.cluster_id)
    placed_ago(low, 2)
    placed_ago(normal, 2)
    api = APIClient()
    api.force_authenticate(alice)
    page = Client()
    page.force_login(alice)

    until = timezone.localtime(Job.objects.get(pk=low.pk).placed_at + timedelta(seconds=600))
    assert api.get(f"/api/jobs/{low.pk}/").json()["protected_until"] is not None
    assert f"Protected from preemption until {until:%H:%M}" in page.get(f"/jobs/{low.pk}/").content.decode()
    assert api.get(f"/api/jobs/{normal.pk}/").json()["protected_until"] is None  # its class is not preemptible
    assert "Protected from preemption" not in page.get(f"/jobs/{normal.pk}/").content.decode()

    Job.objects.filter(pk=low.pk).update(preemption_shielded=True, preemptions=3)
    assert "Protected from preemption until it ends: preempted 3 times" in page.get(f"/jobs/{low.pk}/").content.decode()
    lifecycle.cancel(low.pk, "alice")
    assert api.get(f"/api/jobs/{low.pk}/").json()["protected_until"] is None
