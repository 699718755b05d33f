"""GET /metrics, parsed by prometheus_client's own parser: every family there, each value what the API and the stored
rows and counters say; staff or the scrape token only."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from contracts import broker
from contracts.protocol import TASK_METRICS
from orchestrator.agents.reports import REPORT_LAG
from orchestrator.models import Host, Job, JobState, Task
from orchestrator.plumbing import counters
from orchestrator.scheduler import scheduling
from tests import factories
from tests.orchestrator.metrics.conftest import HOST, consumer
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db(transaction=True)

FAMILIES = {
    "tfdash_jobs", "tfdash_queue_length", "tfdash_queue_oldest_wait_seconds", "tfdash_hosts",
    "tfdash_host_heartbeat_age_seconds", "tfdash_heartbeat_lag_seconds", "tfdash_stream_backlog_entries",
    "tfdash_ingest_oldest_waiting_seconds", "tfdash_ingest_points_stored", "tfdash_ingest_entries_handled",
    "tfdash_dead_letters", "tfdash_agent_messages_refused", "tfdash_scheduler_pass_seconds", "tfdash_orders_resent",
    "tfdash_scrape_ok", "tfdash_scrape_duration_seconds", "tfdash_usage_device_seconds",
}  # fmt: skip


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("carol", password="pw-carol-123", is_staff=True)


def scrape(client: Client) -> dict[str, dict[tuple, float]]:
    """family -> {(sample name, sorted labels): value}"""
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return {
        family.name: {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
        for family in text_string_to_metric_families(response.content.decode())
    }


def one(families: dict, family: str, sample: str | None = None, **labels: str) -> float:
    return families[family][(sample or family, tuple(sorted(labels.items())))]


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_every_family_matches_the_api_rows_and_counters(staff, alice, redis_url, settings):
    import redis

    stream_client = redis.Redis.from_url(redis_url)
    stream_name = broker.stream(HOST, broker.METRICS)
    stream_client.delete(stream_name)
    host, token = factories.host(HOST)
    other, _ = factories.host("gpu-9", cluster_name="gpus", port_min=25000)
    Host.objects.filter(pk=host.pk).update(status="online", last_heartbeat=timezone.now() - timedelta(seconds=4))
    Host.objects.filter(pk=other.pk).update(status="offline")
    lab, gpus = host.cluster, other.cluster

    def job(state: str, cluster=lab, age_s: float = 0) -> Job:
        made = Job.objects.create(owner=alice, cluster=cluster, name=state, strategy="mirrored", program_kind="script",
                                  state=state, attempt=1)  # fmt: skip
        Job.objects.filter(pk=made.pk).update(created_at=timezone.now() - timedelta(seconds=age_s))
        return made

    running = job("running")
    Task.objects.create(job=running, attempt=1, type="worker", index=0, host=host, state="running")
    for state, cluster, age in [("queued", lab, 100), ("queued", lab, 40), ("succeeded", lab, 0),
                                ("failed", gpus, 0), ("cancelled", gpus, 0), ("queued", gpus, 7)]:  # fmt: skip
        job(state, cluster, age)
    client = signed_in(staff)
    before = scrape(client)

    # Three entries wait on the host's metrics stream: two good reports and one not sealed by the host.
    def add(body: dict, with_token: str = token) -> None:
        envelope = sealed(HOST, with_token, TASK_METRICS, body)
        stream_client.xadd(stream_name, {"name": TASK_METRICS, "envelope": json.dumps(envelope)})

    for step in (1, 2):
        event = {"kind": "metric", "ts": time.time(), "mono": 1.0, "step": step, "epoch": 0, "phase": "train",
                 "metrics": {"loss": 1 / step, "accuracy": 0.5}}  # fmt: skip
        add({"task_id": running.tasks.get().pk, "attempt": 1, "events": [event]})
    add({"task_id": running.tasks.get().pk, "attempt": 1, "events": []}, with_token="not-the-hosts-token")
    stream_client.xadd(stream_name, {"name": TASK_METRICS, "envelope": b"not json"})  # a dead letter
    waiting = scrape(client)
    assert one(waiting, "tfdash_stream_backlog_entries", kind="metrics") == stream_client.xlen(stream_name) == 4
    assert one(waiting, "tfdash_ingest_oldest_waiting_seconds") >= 0
    reader = consumer(stream_client, stream_name)
    reader.drain_once()
    scheduling.schedule_cluster(factories.cluster("idle").pk)  # a pass over a cluster with an empty queue
    counters.record_readings(REPORT_LAG, {HOST: 0.25})
    after = scrape(client)

    assert set(after) >= FAMILIES
    assert one(after, "tfdash_scrape_ok", source="database") == one(after, "tfdash_scrape_ok", source="redis") == 1
    # Jobs by state and cluster: as the API lists them.
    api = APIClient()
    api.force_authenticate(staff)
    for state in JobState.values:
        listed = api.get(f"/api/jobs/?state={state}&limit=1000").json()["results"]
        for cluster in (lab, gpus):
            expected = sum(1 for j in listed if j["cluster"] in (cluster.pk, cluster.name))
            assert one(after, "tfdash_jobs", cluster=cluster.name, state=state) == expected, (state, cluster.name)
    queued = api.get("/api/jobs/?state=queued&limit=1000").json()["results"]
    assert one(after, "tfdash_queue_length", cluster="lab") == 2 == sum(j["cluster"] in (lab.pk, "lab") for j in queued)
    assert one(after, "tfdash_queue_length", cluster="gpus") == 1
    assert one(after, "tfdash_queue_length", cluster="idle") == 0
    assert 100 <= one(after, "tfdash_queue_oldest_wait_seconds", cluster="lab") < 130
    assert 7 <= one(after, "tfdash_queue_oldest_wait_seconds", cluster="gpus") < 37
    # Hosts by status: as the API lists them.
    for cluster in (lab, gpus):
        statuses = [h["status"] for h in api.get(f"/api/clusters/{cluster.pk}/hosts/?limit=1000").json()["results"]]
        for status in ("online", "offline", "unknown"):
            assert one(after, "tfdash_hosts", cluster=cluster.name, status=status) == statuses.count(status)
    assert 4 <= one(after, "tfdash_host_heartbeat_age_seconds", cluster="lab", host=HOST) < 34
    assert one(after, "tfdash_heartbeat_lag_seconds", host=HOST) == 0.25
    # The ingest: what it stored is what the metrics API serves; the backlog is gone.
    points = api.get(f"/api/jobs/{running.pk}/metrics/").json()["points"]
    assert len(points) == 4

    def grew(family: str, sample: str, **labels: str) -> float:
        return one(after, family, sample, **labels) - before[family].get((sample, tuple(sorted(labels.items()))), 0)

    # At least (both counters): they are the Redis's, and an ingest another test left draining on the same Redis (the
    # suite's, under load) may store and handle its own entries between the two scrapes.
    assert grew("tfdash_ingest_points_stored", "tfdash_ingest_points_stored_total") >= len(points)
    # The refused one too.
    assert grew("tfdash_ingest_entries_handled", "tfdash_ingest_entries_handled_total") >= 3
    assert one(after, "tfdash_stream_backlog_entries", kind="metrics") == 0
    assert grew("tfdash_dead_letters", "tfdash_dead_letters_total", kind="metrics") == 1
    assert grew("tfdash_agent_messages_refused", "tfdash_agent_messages_refused_total",
                reason="bad_mac_or_unknown_host") == 1  # fmt: skip
    # At least one, as the ingest's counters above: the count is the Redis's, and a clean-clone run under load counted
    # 2 (a pass from elsewhere on the same Redis landed between the scrapes).
    assert grew("tfdash_scheduler_pass_seconds", "tfdash_scheduler_pass_seconds_count") >= 1
    assert grew("tfdash_scheduler_pass_seconds", "tfdash_scheduler_pass_seconds_sum") > 0
    assert one(after, "tfdash_orders_resent", "tfdash_orders_resent_total") == counters.get("orders_resent")
    stream_client.delete(stream_name)


def test_only_staff_or_the_scrape_token_may_read_it(alice, settings):
    settings.TFDASH_METRICS_TOKEN = "s3cret-scrape-token"
    assert Client().get("/metrics").status_code == 401
    assert signed_in(alice).get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")
    assert response.status_code == 200
    assert "tfdash_jobs" in {f.name for f in text_string_to_metric_families(response.content.decode())}
    settings.TFDASH_METRICS_TOKEN = ""
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_the_grafana_dashboard_charts_only_families_the_scrape_has():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text()
    used = {re.sub(r"_(total|sum|count)$", "", name) for name in re.findall(r"tfdash_[a-z_]+", text)}
    used -= {"tfdash_control_plane"}  # the dashboard's own uid
    assert used and used <= FAMILIES, used - FAMILIES
