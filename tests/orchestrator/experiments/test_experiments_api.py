"""Experiments through the REST API and the control loop's `advance`, with hand-made job ends (no TF): create, list,
detail, cancel, outsiders' 404, refusals with their message, one job per variant whatever is called twice."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from orchestrator.experiments import actions as experiments
from orchestrator.models import Experiment, Host, Job
from tests import factories

pytestmark = pytest.mark.django_db

BASELINE = {"strategy": "mirrored", "workers": 1, "ps": 0, "devices_per_worker": 1}
MIRRORED_2 = {"strategy": "mirrored", "workers": 1, "ps": 0, "devices_per_worker": 2}
MWMS_2 = {"strategy": "multi_worker_mirrored", "workers": 2, "ps": 0, "devices_per_worker": 1}


@pytest.fixture
def lab() -> None:
    for i in range(2):
        host, _ = factories.host(f"lab-{i}", port_min=25000 + 100 * i)
        Host.objects.filter(pk=host.pk).update(cpu_slots=2)


def client_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def body(**extra: Any) -> dict[str, Any]:
    return {
        "name": "which is faster",
        "builtin": "digits_mlp",
        "builtin_config": {"epochs": 2, "per_replica_batch": 32},
        "variants": [BASELINE, MIRRORED_2, MWMS_2],
        **extra,
    }


def end(job: Job, state: str = "succeeded") -> None:
    Job.objects.filter(pk=job.pk).update(state=state)


def test_create_runs_the_variants_one_after_another_each_an_ordinary_job(alice, lab) -> None:
    response = client_for(alice).post("/api/experiments/", body(), format="json")

    assert response.status_code == 201, response.content
    data = response.json()
    assert data["mode"] == "sequential" and data["state"] in ("queued", "running")
    assert [v["label"] for v in data["summary"]["variants"]] == [
        "1-replica baseline",
        "Mirrored × 2 devices",
        "MultiWorkerMirrored 2 × 1",
    ]
    experiment = Experiment.objects.get(pk=data["id"])
    assert [v["reason"] for v in data["summary"]["variants"][1:]] == ["waits for the run before it to end"] * 2
    (first,) = experiment.jobs.all()  # one at a time
    assert (first.variant, first.strategy, first.devices_per_worker, first.state) == (
        "1-replica baseline", "mirrored", 1, "queued"
    )  # fmt: skip
    assert first.builtin == "digits_mlp" and first.builtin_config == {"epochs": 2, "per_replica_batch": 32}
    assert first.owner == alice and first.name == "which is faster · 1-replica baseline"

    # Level-triggered and idempotent: while the first runs, another pass submits nothing.
    assert experiments.advance_all() == []
    end(first)
    (second_id,) = experiments.advance_all()
    assert experiments.advance_all() == []
    assert Job.objects.get(pk=second_id).variant == "Mirrored × 2 devices"
    end(Job.objects.get(pk=second_id), "failed")  # a failed variant does not stop the experiment
    (third_id,) = experiments.advance_all()
    end(Job.objects.get(pk=third_id))
    assert experiments.advance_all() == []
    assert experiment.jobs.count() == 3
    assert not Experiment.objects.get(pk=experiment.pk).pending
    detail = client_for(alice).get(f"/api/experiments/{experiment.pk}/").json()
    assert detail["state"] == "failed"  # every variant ended, one of them failed
    assert [j["variant"] for j in detail["jobs"]] == [v["label"] for v in detail["summary"]["variants"]]
    assert "Mirrored × 2 devices failed" in detail["summary"]["verdict"]


def test_side_by_side_submits_every_variant_at_once(alice, lab) -> None:
    response = client_for(alice).post(
        "/api/experiments/", body(mode="parallel", variants=[BASELINE, MWMS_2]), format="json"
    )

    assert response.status_code == 201, response.content
    assert sorted(Job.objects.filter(experiment_id=response.json()["id"]).values_list("variant", flat=True)) == [
        "1-replica baseline",
        "MultiWorkerMirrored 2 × 1",
    ]


def test_side_by_side_is_refused_where_the_cluster_cannot_hold_every_variant_at_once(alice, lab) -> None:
    # 1 + 2 + 2 device slots on two hosts of 2: together they never fit.
    response = client_for(alice).post("/api/experiments/", body(mode="parallel"), format="json")

    assert response.status_code == 400
    (message,) = response.json()["mode"]
    assert message.startswith("These variants cannot run side by side on cluster lab, even idle (")
    assert message.endswith("; run them one after another.")
    assert not Experiment.objects.exists() and not Job.objects.exists()


def test_list_shows_own_experiments_staff_all_and_outsiders_get_404(alice, bob, django_user_model, lab) -> None:
    mine = client_for(alice).post("/api/experiments/", body(), format="json").json()["id"]
    staff = django_user_model.objects.create_user("sam", password="pw-sam-123", is_staff=True)

    assert [e["id"] for e in client_for(alice).get("/api/experiments/").json()["results"]] == [mine]
    assert client_for(bob).get("/api/experiments/").json()["results"] == []
    assert [e["id"] for e in client_for(staff).get("/api/experiments/").json()["results"]] == [mine]
    assert client_for(bob).get(f"/api/experiments/{mine}/").status_code == 404
    assert client_for(bob).post(f"/api/experiments/{mine}/cancel/").status_code == 404
    assert Experiment.objects.get(pk=mine).cancelled_at is None
    assert APIClient().get("/api/experiments/").status_code in (401, 403)


def test_cancel_cancels_its_jobs_and_starts_no_further_one(alice, lab) -> None:
    api = client_for(alice)
    experiment_id = api.post("/api/experiments/", body(), format="json").json()["id"]

    response = api.post(f"/api/experiments/{experiment_id}/cancel/")

    assert response.status_code == 200, response.content
    assert response.json()["state"] == "cancelled"
    assert list(Job.objects.filter(experiment_id=experiment_id).values_list("state", flat=True)) == ["cancelled"]
    assert experiments.advance_all() == []
    assert Job.objects.filter(experiment_id=experiment_id).count() == 1
    again = api.post(f"/api/experiments/{experiment_id}/cancel/")
    assert again.status_code == 409 and again.json() == {"detail": "The experiment has ended (cancelled)."}


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"variants": [BASELINE]}, "variants", "Choose from 2 to 8 variants (1 given)."),
        (
            {"variants": [BASELINE, BASELINE]},
            "variants",
            "Each variant once: 1-replica baseline is given more than once.",
        ),
        ({"variants": [BASELINE, {"strategy": "horovod"}]}, "variants", '"horovod" is not a valid choice.'),
        (
            {"variants": [BASELINE, {"strategy": "parameter_server", "workers": 2, "ps": 0}]},
            "variants",
            "ParameterServer 2 × 1: parameter_server needs at least 1 ps",
        ),
        (
            {"variants": [BASELINE, {"strategy": "mirrored", "devices_per_worker": 5}]},
            "variants",
            "Mirrored × 5 devices: This job can never run on cluster lab",
        ),
        ({"builtin": "nope"}, "builtin", "Unknown built-in program 'nope'"),
        ({"target_accuracy": 1.5}, "target_accuracy", "Ensure this value is less than or equal to 1.0."),
        ({"mode": "all-at-once"}, "mode", '"all-at-once" is not a valid choice.'),
    ],
)
def test_bad_input_is_refused_with_a_message_and_creates_nothing(alice, lab, change, field, message) -> None:
    response = client_for(alice).post("/api/experiments/", body(**change), format="json")

    assert response.status_code == 400, response.content
    assert message in str(response.json()[field]), response.json()
    assert not Experiment.objects.exists() and not Job.objects.exists()


def test_side_by_side_past_the_active_jobs_limit_says_so(alice, lab, settings) -> None:
    settings.TFDASH_MAX_ACTIVE_JOBS_PER_USER = 1

    response = client_for(alice).post(
        "/api/experiments/", body(mode="parallel", variants=[BASELINE, MWMS_2]), format="json"
    )

    assert response.status_code == 400
    (message,) = response.json()["non_field_errors"]
    assert message.startswith("This experiment cannot queue all 2 variants side by side: ")
    assert message == (
        "This experiment cannot queue all 2 variants side by side: that takes 2 places; you have 0 queued or running "
        "jobs and the limit is 1 per user (TFDASH_MAX_ACTIVE_JOBS_PER_USER). Run them one after another (one job at "
        "a time), or wait for jobs to end."
    )
    # One after another holds a single active job, so it fits.
    assert client_for(alice).post("/api/experiments/", body(), format="json").status_code == 201


def test_the_watchdog_tick_submits_the_next_variant_with_no_message_about_the_end(alice, lab) -> None:
    """Level-triggered: a run's end whose scheduler pass was lost (or an orchestrator restarted since) still leads to
    the next run, on the watchdog's next tick."""
    from orchestrator import tasks

    experiment_id = client_for(alice).post("/api/experiments/", body(), format="json").json()["id"]
    (first,) = Job.objects.filter(experiment_id=experiment_id)
    end(first)

    tasks.watchdog()

    assert list(Job.objects.filter(experiment_id=experiment_id).order_by("pk").values_list("variant", flat=True)) == [
        "1-replica baseline",
        "Mirrored × 2 devices",
    ]
