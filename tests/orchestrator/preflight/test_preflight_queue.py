"""A preflight on real PostgreSQL rows, without agents: the submission's default (and the submitter's yes or no), the
scheduler placing the preflight ahead of the queue and never its job while it runs, and its end applied to the job:
passed (the job is placed), failed (the job is refused with the preflight's verdict, and never had a task), cancelled
with its job. The real run, agents and TensorFlow, is tests/orchestrator/test_preflight_e2e.py."""

from __future__ import annotations

import pytest
from django.utils import timezone

from orchestrator.core import preflight
from orchestrator.jobs import lifecycle
from orchestrator.models import Job, JobEvent, JobState, Task, TaskState
from orchestrator.scheduler import scheduling
from tests import factories

pytestmark = pytest.mark.django_db


def hosts(n: int = 2) -> list:  # type: ignore[type-arg]
    made = []
    for i in range(n):
        host, _ = factories.host(f"pf-{i}", port_min=24000 + 100 * i)
        host.cpu_slots, host.status = 1, "online"
        host.save()
        made.append(host)
    return made


def submit(api, **more: object) -> Job:  # type: ignore[no-untyped-def]
    body = {"name": "wide", "builtin": "digits_mlp", "strategy": "multi_worker_mirrored", "workers": 2, **more}
    response = api.post("/api/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return Job.objects.get(pk=response.json()["id"])


def occupy(host, owner) -> Job:  # type: ignore[no-untyped-def]
    """A running one-device job on `host`: the 2-worker gang no longer fits."""
    busy = Job.objects.create(owner=owner, cluster=host.cluster, name="busy", strategy="mirrored",
                              program_kind="builtin", builtin="digits_mlp", state=JobState.RUNNING, attempt=1,
                              placed_at=timezone.now())  # fmt: skip
    Task.objects.create(job=busy, attempt=1, type="worker", index=0, host=host, devices=[0], state=TaskState.RUNNING)
    return busy


def preflight_of(job: Job) -> Job:
    return Job.objects.get(preflight_for=job)


def test_by_default_a_gang_that_must_wait_gets_a_preflight_and_one_that_fits_none(api, bob) -> None:  # type: ignore[no-untyped-def]
    first, _second = hosts()
    fits = submit(api)
    assert fits.preflight == {} and not Job.objects.filter(preflight_for=fits).exists()
    Job.objects.filter(pk=fits.pk).update(state=JobState.CANCELLED)
    occupy(first, bob)

    waits = submit(api)

    run = preflight_of(waits)
    assert waits.preflight["state"] == preflight.RUNNING and waits.preflight["job"] == run.pk
    assert (run.strategy, run.workers, run.ps, run.devices_per_worker) == ("multi_worker_mirrored", 1, 0, 1)
    assert (run.builtin, run.owner_id, run.time_limit_s, run.max_restarts) == ("digits_mlp", waits.owner_id, 150, 0)
    assert run.preflight == {"steps": preflight.STEPS}
    assert submit(api, preflight=False).preflight == {}  # the submitter's no
    assert submit(api, preflight=None).preflight["state"] == preflight.RUNNING  # null: the default
    Job.objects.filter(owner=waits.owner).exclude(pk=run.pk).update(state=JobState.CANCELLED)


def test_asked_for_it_runs_ahead_of_the_queue_and_its_job_waits_until_it_passes(api, bob) -> None:  # type: ignore[no-untyped-def]
    first, _second = hosts()
    earlier = Job.objects.create(owner=bob, cluster=first.cluster, name="earlier", strategy="multi_worker_mirrored",
                                 program_kind="builtin", builtin="digits_mlp", workers=2)  # fmt: skip
    job = submit(api, preflight=True)
    run = preflight_of(job)

    scheduling.schedule_cluster(first.cluster_id)

    job.refresh_from_db()
    assert Job.objects.get(pk=run.pk).state == JobState.STARTING  # ahead of the earlier gang, on one device
    assert Job.objects.get(pk=earlier.pk).state == JobState.QUEUED
    assert job.state == JobState.QUEUED and job.reason == f"preflight #{run.pk} running: it is placed once its " \
        "preflight passes"  # fmt: skip
    assert not Task.objects.filter(job=job).exists()
    Task.objects.filter(job=run).update(state=TaskState.SUCCEEDED, exit_code=0, finished_at=timezone.now())
    lifecycle.end_job(Job.objects.get(pk=run.pk), JobState.SUCCEEDED, "all workers exited 0")

    scheduling.schedule_cluster(first.cluster_id)

    job.refresh_from_db()
    assert job.preflight["state"] == preflight.PASSED and job.state == JobState.QUEUED  # behind the earlier gang now
    event = JobEvent.objects.filter(job=job, kind="preflight").last()
    assert event is not None and event.text.startswith(f"preflight #{run.pk} passed in ")
    assert Job.objects.get(pk=earlier.pk).state == JobState.STARTING
    Task.objects.filter(job=earlier).update(state=TaskState.SUCCEEDED, exit_code=0, finished_at=timezone.now())
    Job.objects.filter(pk=earlier.pk).update(state=JobState.SUCCEEDED)

    scheduling.schedule_cluster(first.cluster_id)

    assert Job.objects.get(pk=job.pk).state == JobState.STARTING and Task.objects.filter(job=job).count() == 2


def test_a_failed_preflight_refuses_its_job_with_its_verdict_and_the_job_never_had_a_task(api, client, alice) -> None:  # type: ignore[no-untyped-def]
    first, _second = hosts()
    job = submit(api, preflight=True)
    run = preflight_of(job)
    scheduling.schedule_cluster(first.cluster_id)
    task = Task.objects.get(job=run)
    Task.objects.filter(pk=task.pk).update(state=TaskState.FAILED, exit_code=1, finished_at=timezone.now())
    task.log_lines.create(seq=1, stream="stderr", text="ModuleNotFoundError: No module named 'not_installed'")
    lifecycle.end_job(Job.objects.get(pk=run.pk), JobState.FAILED, "worker 0 exited with code 1", failed=task)

    scheduling.schedule_cluster(first.cluster_id)

    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.reason.startswith(f"refused by its preflight #{run.pk}: ")
    assert job.preflight["state"] == preflight.FAILED
    assert job.diagnosis["preflight"] == run.pk and job.diagnosis["task_id"] == task.pk
    assert "No module named 'not_installed'" in " ".join(job.diagnosis["evidence"])
    assert not Task.objects.filter(job=job).exists()
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'Preflight <a href="/jobs/{run.pk}/">#{run.pk}</a>: failed: refused by its preflight' in page
    assert f'href="/jobs/{run.pk}/tasks/{task.pk}/' in page  # the verdict's cause: the preflight's own task
    page = client.get(f"/jobs/{run.pk}/").content.decode()
    assert f'Preflight of <a href="/jobs/{job.pk}/">job #{job.pk}</a>' in page


def test_cancelling_a_job_cancels_its_running_preflight(api, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    hosts()
    job = submit(api, preflight=True)
    run = preflight_of(job)

    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.cancel(job.pk, "alice")

    run.refresh_from_db()
    assert run.state == JobState.CANCELLED and run.reason == f"cancelled by the end of job #{job.pk}, which it checks"


def test_the_job_form_asks_for_one(client, alice) -> None:  # type: ignore[no-untyped-def]
    first, _second = hosts()
    client.force_login(alice)
    form = {"name": "from the form", "cluster": str(first.cluster_id), "program": "digits_mlp",
            "strategy": "multi_worker_mirrored", "workers": "2", "ps": "0", "devices_per_worker": "1",
            "max_restarts": "0", "legacy_keras": "on", "startup_deadline_s": "120"}  # fmt: skip
    assert 'name="preflight"' in client.get("/jobs/new/").content.decode()

    response = client.post("/jobs/new/", {**form, "preflight": "true"})

    assert response.status_code == 302, response.content.decode()[-2000:]
    job = Job.objects.get(name="from the form")
    assert job.preflight["state"] == preflight.RUNNING and preflight_of(job).workers == 1
    client.post("/jobs/new/", {**form, "name": "the form's default", "preflight": "unknown"})
    assert Job.objects.get(name="the form's default").preflight == {}  # it fits now: none
