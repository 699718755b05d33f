"""GET /api/usage/ (orchestrator/api/usage_views.py): who sees whose usage (staff everyone's; a user their own and
their groups'; anyone else's refused), per user, group and cluster, and a clear 400 for a bad question."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from orchestrator.models import Cluster
from tests.orchestrator.usage import scenes

pytestmark = pytest.mark.django_db


@pytest.fixture
def who():
    made = scenes.people()
    scenes.mixed_run(made)
    return made


def as_user(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def period() -> dict[str, str]:
    today = timezone.now().date()
    return {"from": str(today - timedelta(days=3)), "to": str(today)}


def accounts(client: APIClient, **params: str) -> dict[str, float]:
    response = client.get("/api/usage/", {**period(), **params})
    assert response.status_code == 200, response.content
    return {a["account"]: a["device_seconds"] for a in response.json()["accounts"]}


def test_staff_see_everyone_by_user_group_and_cluster(who):
    staff = as_user(who["sam"])
    for by in ("user", "group", "cluster"):
        got = accounts(staff, by=by)
        assert got == pytest.approx(scenes.held(by)), by
    assert set(accounts(staff)) == {"alice", "bob", "carol", "dave"}


def test_a_user_sees_their_own_and_their_groups_usage_only(who):
    alice = as_user(who["alice"])
    assert set(accounts(alice)) == {"alice", "bob"}  # bob is in her group
    assert set(accounts(alice, by="group")) == {"vision"}
    assert accounts(alice, by="cluster") == pytest.approx(scenes.held("cluster", owners={"alice", "bob"}))
    assert set(accounts(as_user(who["dave"]))) == {"dave"}  # in no group: his own only
    assert accounts(as_user(who["dave"]), by="group") == {}


def test_another_users_or_groups_usage_is_refused(who):
    alice = as_user(who["alice"])
    for params, message in [
        ({"user": "carol"}, "You may read your own usage and your groups' only."),
        ({"user": "nobody-such"}, "You may read your own usage and your groups' only."),
        ({"group": "nlp"}, "You may read the usage of your own groups only."),
    ]:
        response = alice.get("/api/usage/", params)
        assert (response.status_code, response.json()) == (403, {"detail": message}), params
    assert accounts(alice, user="bob") == pytest.approx({"bob": scenes.held()["bob"]})
    assert accounts(alice, group="vision", by="group") == pytest.approx({"vision": scenes.held("group")["vision"]})


def test_staff_filters_name_what_is_missing(who):
    staff = as_user(who["sam"])
    assert staff.get("/api/usage/", {"user": "nobody-such"}).json() == {"user": ["No user named 'nobody-such'."]}
    assert staff.get("/api/usage/", {"cluster": "mars"}).json() == {"cluster": ["No cluster named 'mars'."]}
    assert accounts(staff, by="group", group="nlp") == pytest.approx({"nlp": scenes.held()["carol"]})


@pytest.mark.parametrize(
    ("params", "body"),
    [
        ({"by": "team"}, {"by": ["`by` is one of user, group, cluster, not 'team'."]}),
        ({"from": "1 May"}, {"from": ["`from` is a date as YYYY-MM-DD (UTC), not '1 May'."]}),
        ({"from": "2025-01-01", "to": "2026-01-02"}, {"from": ["At most 366 days at once; 2025-01-01 to 2026-01-02 is 367."]}),  # noqa: E501
        ({"user": "x" * 151}, {"user": ["`user` is a name of at most 150 characters."]}),
    ],
)  # fmt: skip
def test_a_bad_question_is_a_400_naming_its_field(alice, params, body):
    response = as_user(alice).get("/api/usage/", params)
    assert (response.status_code, response.json()) == (400, body)


def test_signed_out_is_refused(client):
    assert client.get("/api/usage/").status_code in (401, 403)


def test_a_running_task_counts_so_far_and_the_price_gives_a_cost(who):
    scenes.online_host("gpu-lab", gpus=4)
    Cluster.objects.filter(name="gpu-lab").update(price_per_device_hour="2.5")
    job = scenes.placed(who["dave"], "gpu-lab", workers=1, devices=4)
    scenes.run(job, placed_hours_ago=2)

    body = as_user(who["dave"]).get("/api/usage/", {**period(), "cluster": "gpu-lab"}).json()

    (dave,) = body["accounts"]
    assert dave["running_seconds"] == pytest.approx(4 * 2 * 3600, abs=30)
    assert dave["device_seconds"] == dave["running_seconds"]  # dave's ended jobs were on cpu-lab
    assert dave["cost"] == pytest.approx(dave["device_seconds"] / 3600 * 2.5)
    assert dave["by_kind"] == {"gpu": dave["device_seconds"]}
    assert sum(row["device_seconds"] for row in body["days"]) == pytest.approx(dave["device_seconds"])
