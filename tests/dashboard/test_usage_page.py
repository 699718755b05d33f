"""The usage page (dashboard/usage_views.py) without a browser: sign-in required, the same question as the API with
its refusals said on the page (400, 403), the nav link, and the chart's data: every day of the period, the most used
accounts first."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.orchestrator.usage import scenes

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_signed_out_goes_to_the_sign_in_page(client):
    response = client.get("/usage/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_it_shows_a_users_own_and_group_usage_with_the_chart_data(client):
    who = scenes.people()
    scenes.mixed_run(who)
    today = timezone.now().date()

    response = signed_in(who["alice"]).get("/usage/", {"from": str(today - timedelta(days=6)), "to": str(today)})

    page = response.content.decode()
    assert response.status_code == 200 and 'href="/usage/"' in page
    assert set(re.findall(r'<tr data-account="([^"]+)">', page)) == {"alice", "bob"}
    chart = json.loads(re.search(r'<script id="usage-data" type="application/json">(.*?)</script>', page).group(1))
    assert len(chart["days"]) == 7 and chart["days"][1] - chart["days"][0] == 86_400
    held = scenes.held(owners={"alice", "bob"})
    assert [a["name"] for a in chart["accounts"]] == sorted(held, key=lambda name: -held[name])
    for account in chart["accounts"]:
        assert sum(account["hours"]) == pytest.approx(held[account["name"]] / 3600, abs=1e-3)


@pytest.mark.parametrize(
    ("params", "status", "message"),
    [
        ({"to": "2026-02-30"}, 400, "`to`: 2026-02-30 is no calendar date."),
        ({"user": "carol"}, 403, "You may read your own usage and your groups&#x27; only."),
    ],
)
def test_a_refused_question_is_said_on_the_page(params, status, message):
    who = scenes.people()
    response = signed_in(who["alice"]).get("/usage/", params)
    assert response.status_code == status
    assert message in response.content.decode()
