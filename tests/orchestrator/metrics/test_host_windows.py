"""Which host samples belong to a job: one series per host that ran a task, over the job's time there (margin and the
nearest samples on both sides included), thinned when long; and which jobs' pages a fresh sample goes to."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from rest_framework.test import APIClient

from orchestrator.metrics import hosts
from orchestrator.models import HostSample, Job, Task
from tests import factories

pytestmark = pytest.mark.django_db

T0 = 1_800_000_000.0  # the job's first task starts here (wall seconds)


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(T0 + seconds, tz=UTC)


def samples(host, *offsets: float) -> None:
    HostSample.objects.bulk_create(
        HostSample(host=host, ts=T0 + o, cpu_percent=float(o), memory_used_mb=100, memory_total_mb=1000)
        for o in offsets
    )


@pytest.fixture
def ps_job(alice):
    """A finished ParameterServer job over three hosts (chief on a, worker and ps on b), c ran nothing of it; d had a
    task that never started (a launch that failed)."""
    a, _ = factories.host("a")
    b, _ = factories.host("b")
    c, _ = factories.host("c")
    d, _ = factories.host("d")
    job = Job.objects.create(
        owner=alice, cluster=a.cluster, name="ps", strategy="parameter_server", program_kind="script", attempt=1
    )
    common = {"job": job, "attempt": 1, "state": "killed"}
    Task.objects.create(**common, type="chief", index=0, host=a, started_at=at(0), finished_at=at(2))
    Task.objects.create(**common, type="worker", index=0, host=b, started_at=at(0.5), finished_at=at(3))
    Task.objects.create(**common, type="ps", index=0, host=b, started_at=at(1), finished_at=at(2.5))
    Task.objects.create(**common, type="worker", index=1, host=d, started_at=None, finished_at=at(1))
    return job, (a, b, c, d)


def test_each_host_that_ran_a_task_has_its_window_and_samples_around_a_job_shorter_than_the_interval(ps_job):
    job, (a, b, c, d) = ps_job
    # a samples every 20 s (slower than the job lasts): only the nearest sample on each side frames the job.
    samples(a, -40, -20, 20, 40)
    # b samples every second: everything within 5 s of its tasks, and one more on each side.
    samples(b, *range(-8, 10))
    samples(c, 0, 1, 2)
    samples(d, 0, 1, 2)

    windows, found = hosts.job_samples(job.pk)

    assert [(w.host, w.start - T0, w.end - T0) for w in windows] == [("a", -5, 7), ("b", -4.5, 8)]
    by_host = {name: [s["ts"] - T0 for s in found if s["host"] == name] for name in "abcd"}
    assert by_host["a"] == [-20, 20]
    assert by_host["b"] == list(range(-5, 10))  # -5 and 9: the nearest outside [-4.5, 8]
    assert by_host["c"] == by_host["d"] == []
    assert set(found[0]) == {"host", *hosts.SAMPLE_FIELDS}
    # `after` leaves out what a reader already holds.
    assert [s["ts"] - T0 for s in hosts.job_samples(job.pk, after=T0 + 7)[1]] == [20, 8, 9]


def test_a_running_task_keeps_its_hosts_window_open(ps_job):
    job, (a, _b, _c, _d) = ps_job
    Task.objects.create(job=job, attempt=2, type="chief", index=0, host=a, state="running", started_at=at(100))
    samples(a, 99, 500)

    window = next(w for w in hosts.job_windows(job.pk) if w.host == "a")

    assert (window.start - T0, window.end) == (-5, None)
    assert [s["ts"] - T0 for s in hosts.window_samples(window)] == [99, 500]


def test_a_long_window_is_thinned_evenly_and_keeps_its_last_sample(ps_job, monkeypatch):
    job, (a, _b, _c, _d) = ps_job
    monkeypatch.setattr(hosts, "MAX_SAMPLES_PER_HOST", 4)
    samples(a, *[i / 2 for i in range(0, 15)])  # 0 .. 7 every 0.5 s: 15 inside the window [-5, 7]

    found = [s["ts"] - T0 for s in hosts.window_samples(hosts.job_windows(job.pk)[0])]

    assert found == [0, 2, 4, 6, 7]  # every 4th (ceil(15 / 4)), and the last


def test_fresh_samples_go_to_jobs_with_a_started_active_task_or_one_that_just_ended(ps_job):
    job, (a, b, c, d) = ps_job
    other = Job.objects.create(
        owner=job.owner, cluster=job.cluster, name="mw", strategy="multi_worker_mirrored", program_kind="script"
    )
    Task.objects.create(job=other, attempt=1, type="worker", index=0, host=c, state="running", started_at=at(0))
    Task.objects.create(job=other, attempt=1, type="worker", index=1, host=d, state="pending")

    assert hosts.jobs_watching([a.pk, b.pk, c.pk, d.pk], now=T0 + 6) == {
        a.pk: {job.pk},
        b.pk: {job.pk},
        c.pk: {other.pk},
    }
    # b's last task ended at 3: 8 s later the job's page gets its samples no more; c's task still runs.
    assert hosts.jobs_watching([a.pk, b.pk, c.pk], now=T0 + 8.5) == {c.pk: {other.pk}}


def test_the_api_returns_the_same_windows_and_samples(ps_job, alice, bob):
    job, (a, b, _c, _d) = ps_job
    samples(a, 0, 1)
    samples(b, 2)
    api = APIClient()
    api.force_authenticate(alice)

    body = api.get(f"/api/jobs/{job.pk}/hosts/").json()

    assert [w["host"] for w in body["windows"]] == ["a", "b"]
    assert [(s["host"], s["ts"] - T0, s["cpu_percent"]) for s in body["samples"]] == [
        ("a", 0, 0.0),
        ("a", 1, 1.0),
        ("b", 2, 2.0),
    ]
    assert [s["ts"] - T0 for s in api.get(f"/api/jobs/{job.pk}/hosts/", {"since": T0 + 0.5}).json()["samples"]] == [
        1,
        2,
    ]
    assert api.get(f"/api/jobs/{job.pk}/hosts/", {"since": "soon"}).status_code == 400
    api.force_authenticate(bob)
    assert api.get(f"/api/jobs/{job.pk}/hosts/").status_code == 404
