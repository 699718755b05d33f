"""Issue 46's acceptance: after a mixed run (four users in two groups and none, GPU and CPU clusters, tasks of one
and two devices and tasks of none, placed 1 to 30 hours back, across UTC midnights), the API, the usage page,
`tfdash usage` (the real command, installed on its own, against a live server) and Prometheus' counters agree to the
device-second with devices x (end - placement) summed from the tasks' own rows. And a user's CLI sees only what the
API lets them see."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from tests.client.test_cli_e2e import laptop, tfdash_bin  # noqa: F401  (fixtures, reused)
from tests.orchestrator.usage import scenes

pytestmark = pytest.mark.django_db(transaction=True)


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def prometheus(user) -> dict[str, float]:
    """tfdash_usage_device_seconds_total summed per user."""
    body = signed_in(user).get("/metrics").content.decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        if family.name == "tfdash_usage_device_seconds":
            for sample in family.samples:
                if sample.name == "tfdash_usage_device_seconds_total":
                    totals[sample.labels["user"]] = totals.get(sample.labels["user"], 0.0) + sample.value
    return totals


def page(user, params: dict[str, str]) -> dict[str, float]:
    """The usage page's table: account -> its device-seconds (the cell's exact value)."""
    response = signed_in(user).get("/usage/", params)
    assert response.status_code == 200
    cells = re.findall(r'<tr data-account="([^"]+)">.*?data-seconds="([0-9.]+)"', response.content.decode())
    return {account: float(seconds) for account, seconds in cells}


def api(user, params: dict[str, str]) -> dict[str, float]:
    client = APIClient()
    client.force_authenticate(user)
    response = client.get("/api/usage/", params)
    assert response.status_code == 200, response.content
    return {a["account"]: a["device_seconds"] for a in response.json()["accounts"]}


def cli(laptop, url: str, user: str, *args: str) -> dict[str, float]:  # noqa: F811
    """`tfdash usage --json` as `user`: account -> its device-seconds."""
    assert laptop.run("login", url, "-u", user, "--password-stdin", stdin=f"pw-{user}-123\n").returncode == 0
    shown = laptop.run("usage", *args, "--json")
    assert shown.returncode == 0, shown.stderr
    return {a["account"]: a["device_seconds"] for a in json.loads(shown.stdout)["accounts"]}


def agree(expected: dict[str, float], **said: dict[str, float]) -> None:
    """Every source names the same accounts, each within half a second of the tasks' own sum."""
    for source, got in said.items():
        assert set(got) == set(expected), (source, got, expected)
        for account, seconds in expected.items():
            assert abs(got[account] - seconds) < 0.5, (source, account, got[account], seconds)


def test_api_page_cli_and_prometheus_agree_with_the_tasks_after_a_mixed_run(web, laptop):  # noqa: F811
    who = scenes.people()
    scenes.mixed_run(who)
    today = timezone.now().date()
    period = {"from": str(today - timedelta(days=3)), "to": str(today)}
    expected = scenes.held()
    assert set(expected) == {"alice", "bob", "carol", "dave"} and all(s > 3000 for s in expected.values())

    agree(
        expected,
        api=api(who["sam"], period),
        page=page(who["sam"], period),
        cli=cli(laptop, web.url, "sam", "--from", period["from"], "--to", period["to"]),
        prometheus=prometheus(who["sam"]),
    )
    for by in ("group", "cluster"):
        agree(scenes.held(by), api=api(who["sam"], {**period, "by": by}), page=page(who["sam"], {**period, "by": by}),
              cli=cli(laptop, web.url, "sam", "--from", period["from"], "--to", period["to"], "--by", by))  # fmt: skip

    # The table the command prints, rounded to the second, is the same number.
    table = laptop.run("usage", "--from", period["from"], "--to", period["to"]).stdout
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.split()[:1] in (["alice"], ["dave"])}
    assert int(rows["alice"][-2]) == round(expected["alice"])  # device-seconds, then running

    # alice sees herself and bob (her group), in the CLI as in the API; carol's usage is refused.
    mine = cli(laptop, web.url, "alice", "--from", period["from"], "--to", period["to"])
    agree({k: expected[k] for k in ("alice", "bob")}, cli=mine, api=api(who["alice"], period))
    refused = laptop.run("usage", "--user", "carol")
    assert refused.returncode == 3 and "You may read your own usage and your groups' only." in refused.stderr
    bad = laptop.run("usage", "--from", "2026-13-01")
    assert bad.returncode == 5 and "2026-13-01 is no calendar date" in bad.stderr
