"""Jobs list filters, the comparison of finished jobs (numbers from stored points, refusals) and "run again"."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from dashboard import compare
from orchestrator.models import Host, Job, MetricPoint, ProgramKind, Script, Task
from tests import factories

pytestmark = pytest.mark.django_db

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def carol(django_user_model):  # type: ignore[no-untyped-def]
    """Staff: sees everyone's jobs."""
    return django_user_model.objects.create_user("carol", password="pw-carol-123", is_staff=True)


def a_job(owner, **fields) -> Job:
    defaults = {"name": "mnist", "strategy": "multi_worker_mirrored", "program_kind": "script", "workers": 2}
    return Job.objects.create(owner=owner, **{"cluster": factories.cluster(), **defaults, **fields})


def finished_job(owner, name: str, strategy: str, *, workers: int, attempt: int = 1, **fields) -> Job:
    return a_job(
        owner,
        name=name,
        strategy=strategy,
        workers=workers,
        ps=1 if strategy == "parameter_server" else 0,
        state="succeeded",
        attempt=attempt,
        started_at=T0,
        finished_at=T0 + timedelta(seconds=100),
        **fields,
    )


def task(job: Job, kind: str, index: int, *, attempt: int = 1, started: float = 0.0) -> Task:
    return Task.objects.create(
        job=job, attempt=attempt, type=kind, index=index, state="succeeded", started_at=T0 + timedelta(seconds=started)
    )


def epoch_end(t: Task, epoch: int, ts: float, **values: float) -> None:
    MetricPoint.objects.bulk_create(
        MetricPoint(job_id=t.job_id, task=t, phase="epoch_end", name=n, step=epoch * 10, epoch=epoch, value=v, ts=ts)
        for n, v in values.items()
    )


def train(t: Task, *examples_per_s: float) -> None:
    MetricPoint.objects.bulk_create(
        MetricPoint(job_id=t.job_id, task=t, phase="train", name="examples_per_s", step=s, epoch=1, value=v, ts=0.0)
        for s, v in enumerate(examples_per_s, start=1)
    )


def at(seconds: float) -> float:
    return T0.timestamp() + seconds


@pytest.fixture
def two_runs(alice):
    """The same model under MultiWorkerMirrored (2 workers) and ParameterServer (chief + 2 workers + 1 ps)."""
    mwms = finished_job(alice, "mnist-mw", "multi_worker_mirrored", workers=2)
    w0, w1 = task(mwms, "worker", 0, started=2), task(mwms, "worker", 1, started=2)
    epoch_end(w0, 1, at(14), loss=0.9, accuracy=0.6, epoch_time_s=11.5)
    epoch_end(w0, 2, at(24), loss=0.5, accuracy=0.8, epoch_time_s=9.5)
    epoch_end(w1, 2, at(24), loss=7.0, accuracy=0.1, epoch_time_s=99.0)  # not the task that speaks for the job
    train(w0, 400, 600)  # mean 500
    train(w1, 300, 500)  # mean 400: the job does 900 examples/s

    ps = finished_job(alice, "mnist-ps", "parameter_server", workers=2)
    chief = task(ps, "chief", 0, started=1)
    for i in range(2):
        task(ps, "worker", i, started=1)
    task(ps, "ps", 0, started=1)
    # A report() script: no epoch_time_s, so the gaps between epoch ends (the first from the task's start).
    epoch_end(chief, 1, at(21), loss=0.8, accuracy=0.65)
    epoch_end(chief, 2, at(36), loss=0.4, accuracy=0.85)
    train(chief, 1500, 1700)
    return mwms, ps


# --- the list and its filters ---------------------------------------------------------------------------------------
def rows_of(response) -> list[int]:
    return [job.pk for job in response.context["jobs"]]


def test_it_filters_by_state_strategy_and_owner(client, alice, carol):
    done = a_job(alice, name="done", state="succeeded")
    running = a_job(alice, name="running", state="running")
    ps = a_job(alice, name="ps", strategy="parameter_server", ps=1, state="failed")
    mine = a_job(carol, name="carols", state="succeeded")
    client.force_login(carol)

    assert rows_of(client.get("/jobs/?state=succeeded")) == [mine.pk, done.pk]
    assert rows_of(client.get("/jobs/?state=running")) == [running.pk]
    assert rows_of(client.get("/jobs/?state=finished")) == [mine.pk, ps.pk, done.pk]
    assert rows_of(client.get("/jobs/?strategy=parameter_server")) == [ps.pk]
    assert rows_of(client.get("/jobs/?owner=alice&state=succeeded")) == [done.pk]
    assert rows_of(client.get("/jobs/?owner=carol")) == [mine.pk]
    # Not a choice: ignored, not an error.
    assert len(rows_of(client.get("/jobs/?state=bogus&strategy=<b>"))) == 4


def test_it_shows_the_owner_filter_to_staff_only(client, alice, carol):
    a_job(alice)
    client.force_login(carol)
    assert 'id="filter-owner"' in client.get("/jobs/").content.decode()
    client.force_login(alice)
    assert 'id="filter-owner"' not in client.get("/jobs/").content.decode()


def test_bob_cannot_see_alices_jobs_even_by_filtering_on_her_name(client, alice, bob):
    a_job(alice, name="alices-run", state="succeeded")
    theirs = a_job(bob, name="bobs-run", state="succeeded")
    client.force_login(bob)

    assert rows_of(client.get("/jobs/")) == [theirs.pk]
    response = client.get("/jobs/?owner=alice")
    assert rows_of(response) == []
    assert "alices-run" not in response.content.decode()
    assert "No job matches these filters" in response.content.decode()


def test_it_offers_finished_jobs_for_comparison_and_every_job_a_rerun(client, alice):
    done = a_job(alice, state="cancelled")
    running = a_job(alice, state="running")
    client.force_login(alice)

    page = client.get("/jobs/").content.decode()
    assert f'name="ids" value="{done.pk}"' in page
    assert f'name="ids" value="{running.pk}"' not in page
    assert f'href="/jobs/new/?from={done.pk}"' in page and f'href="/jobs/new/?from={running.pk}"' in page


def test_it_escapes_job_names(client, alice):
    a_job(alice, name="<script>alert(1)</script>", state="succeeded")
    client.force_login(alice)

    page = client.get("/jobs/").content.decode()
    assert "<script>alert(1)" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


# --- the comparison's numbers ---------------------------------------------------------------------------------------
def test_it_computes_epoch_times_throughput_and_final_metrics_from_stored_points(alice, two_runs):
    mwms, ps = two_runs

    result = compare.compare(Job.objects.visible_to(alice), [ps.pk, mwms.pk])

    mw_run, ps_run = result.runs
    assert (mw_run.job, ps_run.job) == (mwms, ps)  # by id
    assert (mw_run.speaker, ps_run.speaker) == ("worker 0", "chief 0")
    # The runtime's own epoch_time_s, from worker 0 only.
    assert [e.wall_s for e in mw_run.epochs] == [11.5, 9.5]
    assert mw_run.mean_epoch_s == 10.5
    # No epoch_time_s: from the chief's start (1 s) to the first epoch end (21 s), then between epoch ends.
    assert [e.wall_s for e in ps_run.epochs] == [20.0, 15.0]
    # The wall-time axis: seconds from the job's first task start.
    assert [e.elapsed_s for e in mw_run.epochs] == [12.0, 22.0]
    assert [e.elapsed_s for e in ps_run.epochs] == [20.0, 35.0]
    assert mw_run.examples_per_s == pytest.approx(900.0)
    assert ps_run.examples_per_s == pytest.approx(1600.0)
    assert mw_run.final == {"loss": 0.5, "accuracy": 0.8}
    assert ps_run.final == {"loss": 0.4, "accuracy": 0.85}
    assert mw_run.run_s == 98.0 and ps_run.run_s == 99.0
    assert result.metrics == ["loss", "accuracy"]

    rows = {row.key: row for row in result.summary()}
    assert [c.text for c in rows["mean_epoch_s"].cells] == ["10.5 s", "17.5 s"]
    assert [c.best for c in rows["mean_epoch_s"].cells] == [True, False]
    assert [c.text for c in rows["examples_per_s"].cells] == ["900", "1,600"]
    assert [c.best for c in rows["examples_per_s"].cells] == [False, True]
    assert [c.text for c in rows["final_loss"].cells] == ["0.5000", "0.4000"]
    assert [c.best for c in rows["final_accuracy"].cells] == [False, True]

    charts = result.chart_data()
    assert [j["epoch"] for j in charts["jobs"]] == [[1, 2], [1, 2]]
    assert charts["jobs"][1]["values"]["loss"] == [0.8, 0.4]


def test_a_restarted_job_counts_the_later_placement(alice):
    job = finished_job(alice, "restarted", "multi_worker_mirrored", workers=1, attempt=2)
    first, second = task(job, "worker", 0, attempt=1), task(job, "worker", 0, attempt=2, started=50)
    epoch_end(first, 1, at(10), loss=1.0, epoch_time_s=10)
    epoch_end(first, 2, at(20), loss=0.9, epoch_time_s=10)  # its checkpoint was lost: epoch 2 is run again
    epoch_end(second, 2, at(62), loss=0.7, epoch_time_s=12)
    epoch_end(second, 3, at(70), loss=0.6, epoch_time_s=8)
    train(first, 100)
    train(second, 200, 300)
    other = finished_job(alice, "other", "mirrored", workers=1)

    run = compare.compare(Job.objects.visible_to(alice), [job.pk, other.pk]).runs[0]

    assert [(e.number, e.wall_s, e.values["loss"]) for e in run.epochs] == [(1, 10, 1.0), (2, 12, 0.7), (3, 8, 0.6)]
    assert run.examples_per_s == 250.0


# --- the page and its refusals ---------------------------------------------------------------------------------------
def test_the_page_shows_both_jobs_side_by_side(client, alice, two_runs):
    mwms, ps = two_runs
    client.force_login(alice)

    response = client.get(f"/jobs/compare/?ids={mwms.pk}&ids={ps.pk}")

    assert response.status_code == 200
    page = response.content.decode()
    for text in ("mnist-mw", "mnist-ps", "10.5 s", "17.5 s", "11.5 s", "15.0 s", "0.5000", "0.8500", "1,600"):
        assert text in page, text
    assert 'id="compare-data"' in page and "compare.js" in page
    assert f'href="/jobs/new/?from={ps.pk}"' in page
    # Comma-separated ids work as well.
    assert client.get(f"/jobs/compare/?ids={mwms.pk},{ps.pk}").status_code == 200


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        ("", 400, "Choose at least two finished jobs"),
        ("?ids={mw}", 400, "Choose at least two finished jobs"),
        ("?ids={mw}&ids={mw}", 400, "Choose at least two finished jobs"),
        ("?ids={mw}&ids=abc", 400, "“abc” is not a job number."),
        ("?ids={mw}&ids=999999", 404, "No job #999999 among the jobs you can see."),
        ("?ids={mw}&ids=99999999999999999999", 404, "among the jobs you can see"),
        ("?ids={mw}&ids={running}", 400, "is running"),
        ("?" + "&".join(f"ids={i}" for i in range(1, 10)), 400, "at most 8 jobs"),
    ],
)
def test_it_refuses_what_cannot_be_compared_with_a_clear_message(client, alice, two_runs, query, status, message):
    mwms, _ = two_runs
    running = a_job(alice, state="running")
    client.force_login(alice)

    response = client.get("/jobs/compare/" + query.format(mw=mwms.pk, running=running.pk))

    assert response.status_code == status
    assert message in response.content.decode()


def test_bob_cannot_compare_alices_jobs(client, alice, bob, carol, two_runs):
    mwms, ps = two_runs
    own = finished_job(bob, "bobs", "mirrored", workers=1)
    client.force_login(bob)

    for query in (f"ids={mwms.pk}&ids={ps.pk}", f"ids={own.pk}&ids={ps.pk}"):
        response = client.get(f"/jobs/compare/?{query}")
        assert response.status_code == 404
        assert "mnist-ps" not in response.content.decode()
        assert f"#{ps.pk} among the jobs you can see" in response.content.decode()

    client.force_login(carol)  # staff
    assert client.get(f"/jobs/compare/?ids={mwms.pk}&ids={own.pk}").status_code == 200


def test_the_compare_page_needs_a_login(client):
    response = client.get("/jobs/compare/?ids=1&ids=2")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_it_escapes_names_on_the_compare_page(client, alice, two_runs):
    mwms, ps = two_runs
    Job.objects.filter(pk=ps.pk).update(name="</script><script>alert(1)</script>")
    client.force_login(alice)

    page = client.get(f"/jobs/compare/?ids={mwms.pk}&ids={ps.pk}").content.decode()

    assert "<script>alert(1)" not in page
    assert "\\u003C/script\\u003E\\u003Cscript\\u003Ealert(1)" in page  # json_script's escaping


# --- run again ------------------------------------------------------------------------------------------------------
@pytest.fixture
def online_hosts():
    hosts = [factories.host(f"node-{i}", port_min=27000 + 100 * i)[0] for i in range(2)]
    Host.objects.update(status="online", cpu_count=2)
    return hosts


def test_run_again_fills_in_the_form_from_the_job(client, alice, online_hosts):
    script = Script.objects.create(sha256="ab" * 32, content=b"print(1)\n", size=9, filename="train.py")
    job = a_job(
        alice,
        name="mnist",
        cluster=online_hosts[0].cluster,
        script=script,
        args=["--epochs", "3", "--note", "two words"],
        env={"DATA": "/shared/d.npz", "MODE": "fast"},
        workers=2,
        ps=0,
        devices_per_worker=1,
        labels="fast",
        max_restarts=2,
        legacy_keras=False,
        startup_deadline_s=300,
        state="succeeded",
    )
    client.force_login(alice)

    response = client.get(f"/jobs/new/?from={job.pk}")

    form = response.context["form"]
    assert form.initial == {
        "name": "mnist (again)",
        "cluster": job.cluster_id,
        "strategy": "multi_worker_mirrored",
        "args": "--epochs 3 --note 'two words'",
        "env": "DATA=/shared/d.npz\nMODE=fast",
        "workers": 2,
        "ps": 0,
        "devices_per_worker": 1,
        "labels": "fast",
        "max_restarts": 2,
        "restart_policy": "exit_code",
        "progress_timeout_s": 600,
        "legacy_keras": False,
        "startup_deadline_s": 300,
        "time_limit_s": 86_400,
        "priority": "",
        "environment": "",  # the cluster's default
        "requirements": "",
        "program": "script",
        "earlier_script": script.sha256,
    }
    page = response.content.decode()
    assert 'value="mnist (again)"' in page
    assert f"Filled in from job #{job.pk}" in page and "train.py" in page


def test_run_again_with_another_strategy_reuses_the_stored_script(client, alice, online_hosts):
    script = Script.objects.create(sha256="cd" * 32, content=b"print(1)\n", size=9, filename="train.py")
    job = a_job(alice, cluster=online_hosts[0].cluster, script=script, state="succeeded")
    client.force_login(alice)
    data = {
        "name": "mnist (again)",
        "cluster": str(job.cluster_id),
        "strategy": "mirrored",
        "workers": "1",
        "ps": "0",
        "devices_per_worker": "2",
        "max_restarts": "0",
        "startup_deadline_s": "120",
        "args": "",
    }

    response = client.post(f"/jobs/new/?from={job.pk}", data)

    rerun = Job.objects.exclude(pk=job.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{rerun.pk}/"
    assert (rerun.strategy, rerun.script_id, rerun.program_kind) == ("mirrored", script.pk, ProgramKind.SCRIPT)

    # A file chosen in the form replaces it.
    data["script"] = SimpleUploadedFile("other.py", b"print(2)\n")
    client.post(f"/jobs/new/?from={job.pk}", data)
    assert Job.objects.order_by("-pk").first().script.filename == "other.py"


def test_run_again_carries_a_builtin_program_and_its_config(client, alice, online_hosts):
    job = a_job(
        alice,
        cluster=online_hosts[0].cluster,
        program_kind="builtin",
        builtin="digits_mlp",
        builtin_config={"epochs": 2},
        state="failed",
    )
    client.force_login(alice)
    assert "built-in program digits_mlp" in client.get(f"/jobs/new/?from={job.pk}").content.decode()

    data = {"name": "again", "cluster": str(job.cluster_id), "strategy": "mirrored", "workers": "1", "ps": "0"}
    data.update({"devices_per_worker": "1", "max_restarts": "0", "startup_deadline_s": "120"})
    client.post(f"/jobs/new/?from={job.pk}", data)

    rerun = Job.objects.exclude(pk=job.pk).get()
    assert (rerun.program_kind, rerun.builtin, rerun.builtin_config) == ("builtin", "digits_mlp", {"epochs": 2})


def test_bob_cannot_run_alices_job_again(client, alice, bob):
    job = a_job(alice, state="succeeded")
    client.force_login(bob)

    assert client.get(f"/jobs/new/?from={job.pk}").status_code == 404
    assert client.post(f"/jobs/new/?from={job.pk}", {"name": "x"}).status_code == 404
    assert client.get("/jobs/new/?from=nope").status_code == 404
