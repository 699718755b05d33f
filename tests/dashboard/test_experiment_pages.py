"""The New job form's Compare strategies section and the experiment page, through Django's test client (no TF): the
page renders the summary the API returns (hand-made metric points), outsiders get 404, cancel and target work."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from orchestrator.experiments.summary import summarize
from orchestrator.models import Experiment, Host, Job, MetricPoint, Task
from tests import factories

pytestmark = pytest.mark.django_db

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def lab() -> None:
    for i in range(2):
        host, _ = factories.host(f"lab-{i}", port_min=25000 + 100 * i)
        Host.objects.filter(pk=host.pk).update(cpu_slots=2)


def signed_in(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def form_post(**extra: object) -> dict[str, object]:
    return {
        "name": "which is faster",
        "cluster": factories.cluster().pk,
        "program": "digits_mlp",
        "strategy": "multi_worker_mirrored",
        "workers": 2,
        "ps": 0,
        "devices_per_worker": 1,
        "max_restarts": 0,
        "startup_deadline_s": 120,
        "legacy_keras": "on",
        "epochs": 2,
        "per_replica_batch": 32,
        "compare": "1",
        "variants": ["mirrored:1:0:1", "mirrored:1:0:2", "multi_worker_mirrored:2:0:1"],
        "experiment_mode": "sequential",
        "target_accuracy": "0.8",
        **extra,
    }


def finish(job: Job, *, examples_per_s: float, accuracy: tuple[float, float], start_s: float = 0.0) -> None:
    """A succeeded run with two epochs ending 5 and 10 s after its task started."""
    started = T0 + timedelta(seconds=start_s)
    Job.objects.filter(pk=job.pk).update(
        state="succeeded", started_at=started, finished_at=started + timedelta(seconds=11)
    )
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, state="succeeded", started_at=started)
    points = [
        MetricPoint(
            job=job, task=task, phase="train", name="examples_per_s", step=1, epoch=1, value=examples_per_s, ts=0
        )
    ]
    for epoch, acc in enumerate(accuracy, start=1):
        ts = started.timestamp() + 5 * epoch
        for name, value in (("loss", 1.0 / epoch), ("accuracy", acc), ("epoch_time_s", 5.0)):
            points.append(
                MetricPoint(
                    job=job, task=task, phase="epoch_end", name=name, step=epoch, epoch=epoch, value=value, ts=ts
                )
            )
    MetricPoint.objects.bulk_create(points)


def test_the_form_starts_an_experiment_and_its_page_shows_what_the_api_returns(alice, lab) -> None:
    client = signed_in(alice)
    assert "Compare strategies" in client.get("/jobs/new/").content.decode()

    response = client.post("/jobs/new/", form_post())

    experiment = Experiment.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/experiments/{experiment.pk}/"
    assert experiment.target_accuracy == 0.8 and experiment.template["builtin"] == "digits_mlp"
    assert experiment.template["builtin_config"]["epochs"] == 2
    (baseline,) = experiment.jobs.all()
    finish(baseline, examples_per_s=1000.0, accuracy=(0.5, 0.85))
    from orchestrator.experiments import actions as experiments

    (mirrored_id,) = experiments.advance_all()
    finish(Job.objects.get(pk=mirrored_id), examples_per_s=1500.0, accuracy=(0.82, 0.9))
    (mwms_id,) = experiments.advance_all()
    finish(Job.objects.get(pk=mwms_id), examples_per_s=400.0, accuracy=(0.4, 0.6))

    page = client.get(f"/experiments/{experiment.pk}/")
    html = page.content.decode()
    api = client.get(f"/api/experiments/{experiment.pk}/").json()

    assert page.context["summary"] == api["summary"]
    assert api["state"] == "succeeded"
    baseline_row, mirrored_row, mwms_row = api["summary"]["variants"]
    assert mirrored_row["scaling_efficiency"] == pytest.approx(0.75)
    assert mwms_row["scaling_efficiency"] == pytest.approx(0.2)
    assert (baseline_row["time_to_target_s"], baseline_row["epochs_to_target"]) == (10.0, 2)
    assert (mirrored_row["time_to_target_s"], mirrored_row["epochs_to_target"]) == (5.0, 1)
    assert mwms_row["time_to_target_s"] is None
    assert ">75% <span" in html and ">20%<" in html and ">not reached<" in html and ">baseline<" in html
    assert "5.0 s (epoch 1)" in html and "10.0 s (epoch 2)" in html
    assert api["summary"]["verdict"] in html
    assert api["summary"]["verdict"].startswith("Mirrored × 2 devices was the fastest to 80% accuracy: 5.0 s")
    assert 'id="compare-data"' in html and len(api["summary"]["charts"]["jobs"]) == 3


def test_form_refusals_land_on_the_form(alice, lab) -> None:
    client = signed_in(alice)

    one = client.post("/jobs/new/", form_post(variants=["mirrored:1:0:1"]))
    assert one.status_code == 200
    assert "Choose from 2 to 8 variants (1 given)." in one.content.decode()
    no_name = client.post("/jobs/new/", form_post(name=""))
    assert no_name.status_code == 200 and "This field is required." in no_name.content.decode()
    assert not Experiment.objects.exists() and not Job.objects.exists()


def test_outsiders_get_404_and_the_owner_can_cancel_and_set_the_target(alice, bob, lab) -> None:
    signed_in(alice).post("/jobs/new/", form_post())
    experiment = Experiment.objects.get()
    url = f"/experiments/{experiment.pk}/"

    assert signed_in(bob).get(url).status_code == 404
    assert signed_in(bob).post(url + "cancel/").status_code == 404
    assert signed_in(bob).post(url + "target/", {"target_accuracy": "0.5"}).status_code == 404

    owner = signed_in(alice)
    owner.post(url + "target/", {"target_accuracy": "0.95"})
    assert Experiment.objects.get().target_accuracy == 0.95
    owner.post(url + "target/", {"target_accuracy": "7"})
    assert Experiment.objects.get().target_accuracy == 0.95
    owner.post(url + "cancel/")
    assert summarize(Experiment.objects.get())["state"] == "cancelled"
    assert list(Job.objects.values_list("state", flat=True)) == ["cancelled"]
    assert "Cancel the experiment" not in owner.get(url).content.decode()
