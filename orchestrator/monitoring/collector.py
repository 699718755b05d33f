"""The Prometheus collector behind GET /metrics: every family is read when Prometheus scrapes, from the rows
(PostgreSQL) and the counters and streams (Redis), never kept in a process's memory, so any web process answers the
same and a restart loses nothing.

Cheap and bounded: a handful of aggregate queries over indexed columns under a statement timeout, one pipelined
round trip for the hosts' stream lengths, one for the counters, all under short socket timeouts. A source that fails
(Redis away, a query over its time) leaves its families out and says so in `tfdash_scrape_ok{source=...}` = 0, so a
scrape never hangs and never errors because one part of the house is down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from contracts import broker
from orchestrator.agents import reconcile
from orchestrator.agents.reports import REPORT_LAG
from orchestrator.identity import auth, foreign
from orchestrator.leases import store as leases
from orchestrator.metrics import stream as metrics_stream
from orchestrator.models import Cluster, Host, HostStatus, Job, JobState
from orchestrator.plumbing import counters, streams
from orchestrator.scheduler import scheduling
from orchestrator.usage import reads as usage_reads

log = logging.getLogger(__name__)

STATEMENT_TIMEOUT_MS = 2000
LAG_MAX_AGE_S = 60.0  # a host's heartbeat lag is shown while it is this fresh
# Why agent messages were refused: the label each counter is shown under.
REFUSAL_REASONS = {
    "bad_mac_or_unknown_host": auth.REFUSED,
    "stale": auth.STALE,
    "replayed": auth.REPLAYED,
    "malformed": auth.MALFORMED,
    "other_hosts_task": foreign.OTHER_HOSTS_TASKS,
}


@dataclass
class Rows:
    """What the database says, read in one short transaction."""

    clusters: list[str] = field(default_factory=list)
    jobs: dict[tuple[str, str], int] = field(default_factory=dict)  # (cluster, state) -> count
    queued: dict[str, tuple[int, float]] = field(default_factory=dict)  # cluster -> (length, oldest wait s)
    hosts: dict[tuple[str, str], int] = field(default_factory=dict)  # (cluster, status) -> count
    heartbeat_age: list[tuple[str, str, float]] = field(default_factory=list)  # (cluster, host, seconds)
    host_names: list[str] = field(default_factory=list)
    leases: list[leases.Held] = field(default_factory=list)
    usage: list[tuple[str, str, str, float]] = field(default_factory=list)  # (user, cluster, kind, device-seconds)


def read_rows() -> Rows:
    rows = Rows()
    now = timezone.now()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
        rows.clusters = list(Cluster.objects.order_by("name").values_list("name", flat=True))
        by_state = Job.objects.order_by().values_list("cluster__name", "state").annotate(n=Count("pk"))
        rows.jobs = {(cluster, state): n for cluster, state, n in by_state}
        queue = (
            Job.objects.filter(state=JobState.QUEUED)
            .order_by()
            .values_list("cluster__name")
            .annotate(n=Count("pk"), oldest=Min("created_at"))
        )
        rows.queued = {cluster: (n, (now - oldest).total_seconds()) for cluster, n, oldest in queue}
        by_status = Host.objects.order_by().values_list("cluster__name", "status").annotate(n=Count("pk"))
        rows.hosts = {(cluster, status): n for cluster, status, n in by_status}
        hosts = Host.objects.order_by("name").values_list("cluster__name", "name", "last_heartbeat")
        for cluster, name, last in hosts:
            rows.host_names.append(name)
            if last is not None:
                rows.heartbeat_age.append((cluster, name, max(0.0, (now - last).total_seconds())))
        rows.leases = leases.read_all()
        rows.usage = usage_reads.totals()  # the rollup summed: rows per user, cluster, kind and day, not tasks
    return rows


@dataclass
class Readings:
    """What Redis says: counters, readings and the hosts' stream lengths."""

    counters: dict[str, int] = field(default_factory=dict)
    pass_time: tuple[int, float] = (0, 0.0)
    lags: dict[str, float] = field(default_factory=dict)
    backlog: dict[str, int] = field(default_factory=dict)  # stream kind -> entries waiting, all hosts
    oldest_metrics_s: float = 0.0


def read_redis(host_names: list[str]) -> Readings:
    client = counters.client()
    names = [
        *REFUSAL_REASONS.values(),
        *(streams.dead_letter_counter(kind) for kind in broker.STREAM_KINDS),
        metrics_stream.POINTS_STORED,
        metrics_stream.ENTRIES_HANDLED,
        reconcile.ORDERS_RESENT,
    ]
    readings = Readings(counters=counters.get_many(names), pass_time=counters.observed(scheduling.PASS_TIME))
    readings.lags = counters.recent_readings(REPORT_LAG, max_age_s=LAG_MAX_AGE_S)
    # Readers delete what they acknowledged: a host's stream holds only what is not handled yet.
    pipe = client.pipeline(transaction=False)
    for kind in broker.STREAM_KINDS:
        for host in host_names:
            pipe.xlen(broker.stream(host, kind))
    lengths = iter(pipe.execute())
    readings.backlog = {kind: sum(next(lengths) for _ in host_names) for kind in broker.STREAM_KINDS}
    readings.oldest_metrics_s = metrics_stream.waiting_age_s(client, host_names)
    return readings


class TfdashCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        began = time.perf_counter()
        ok = GaugeMetricFamily("tfdash_scrape_ok", "1 when the source could be read for this scrape", labels=["source"])
        host_names: list[str] = []
        try:
            rows = read_rows()
        except DatabaseError:
            log.exception("GET /metrics: the database could not be read")
            ok.add_metric(["database"], 0)
        else:
            ok.add_metric(["database"], 1)
            host_names = rows.host_names
            yield from _row_families(rows)
        try:
            readings = read_redis(host_names)
        except (redis.RedisError, ValueError):
            log.exception("GET /metrics: Redis could not be read")
            ok.add_metric(["redis"], 0)
        else:
            ok.add_metric(["redis"], 1)
            yield from _redis_families(readings)
        yield ok
        duration = GaugeMetricFamily("tfdash_scrape_duration_seconds", "how long this scrape's reads took")
        duration.add_metric([], time.perf_counter() - began)
        yield duration


def _row_families(rows: Rows) -> Iterator[Metric]:
    jobs = GaugeMetricFamily("tfdash_jobs", "jobs by cluster and state", labels=["cluster", "state"])
    for cluster in rows.clusters:
        for state in JobState.values:
            jobs.add_metric([cluster, state], rows.jobs.get((cluster, state), 0))
    yield jobs
    length = GaugeMetricFamily("tfdash_queue_length", "queued jobs waiting for placement", labels=["cluster"])
    oldest = GaugeMetricFamily(
        "tfdash_queue_oldest_wait_seconds", "how long the oldest queued job has waited (0: none)", labels=["cluster"]
    )
    for cluster in rows.clusters:
        n, wait = rows.queued.get(cluster, (0, 0.0))
        length.add_metric([cluster], n)
        oldest.add_metric([cluster], wait)
    yield length
    yield oldest
    hosts = GaugeMetricFamily("tfdash_hosts", "hosts by cluster and status", labels=["cluster", "status"])
    for cluster in rows.clusters:
        for status in HostStatus.values:
            hosts.add_metric([cluster, status], rows.hosts.get((cluster, status), 0))
    yield hosts
    age = GaugeMetricFamily(
        "tfdash_host_heartbeat_age_seconds", "time since the host's last heartbeat", labels=["cluster", "host"]
    )
    for cluster, host, seconds in rows.heartbeat_age:
        age.add_metric([cluster, host], seconds)
    yield age
    # Who acts as the single beat and scheduler (orchestrator/leases/): a series per live holder, none when it lapsed.
    holder = GaugeMetricFamily(
        "tfdash_lease_holder", "1 for the process that holds the lease now", labels=["lease", "holder"]
    )
    left = GaugeMetricFamily(
        "tfdash_lease_expires_in_seconds",
        "time until the lease lapses unless renewed (negative: lapsed)",
        labels=["lease"],
    )
    moves = CounterMetricFamily("tfdash_lease_transitions", "times the lease changed hands", labels=["lease"])
    for lease in rows.leases:
        if lease.live:
            holder.add_metric([lease.name, lease.holder], 1)
        left.add_metric([lease.name], (lease.expires_at - lease.now).total_seconds())
        moves.add_metric([lease.name], lease.transitions)
    yield holder
    yield left
    yield moves
    # Ended tasks' device-seconds (orchestrator/usage/): a running task counts at its end, so the counter never goes
    # down; the API and the page add running tasks' time so far.
    usage = CounterMetricFamily(
        "tfdash_usage_device_seconds",
        "device-seconds of ended tasks (devices held x placement to end), by the job's owner, cluster and device kind",
        labels=["user", "cluster", "kind"],
    )
    for user, cluster, kind, seconds in rows.usage:
        usage.add_metric([user, cluster, kind], seconds)
    yield usage


def _redis_families(readings: Readings) -> Iterator[Metric]:
    got: dict[str, Any] = readings.counters
    lag = GaugeMetricFamily(
        "tfdash_heartbeat_lag_seconds",
        "how late the host's latest report arrived (sealed -> read), while fresh",
        labels=["host"],
    )
    for host, seconds in sorted(readings.lags.items()):
        lag.add_metric([host], seconds)
    yield lag
    backlog = GaugeMetricFamily(
        "tfdash_stream_backlog_entries",
        "entries of the hosts' streams not handled yet (kind=metrics: the ingest backlog)",
        labels=["kind"],
    )
    for kind, n in readings.backlog.items():
        backlog.add_metric([kind], n)
    yield backlog
    oldest = GaugeMetricFamily(
        "tfdash_ingest_oldest_waiting_seconds", "age of the oldest metrics-stream entry the ingest has not stored"
    )
    oldest.add_metric([], readings.oldest_metrics_s)
    yield oldest
    behind = GaugeMetricFamily(
        "tfdash_ingest_behind", "1 when the ingest's oldest unstored entry is older than TFDASH_INGEST_BEHIND_S"
    )
    behind.add_metric([], float(metrics_stream.behind(readings.oldest_metrics_s)))
    yield behind
    points = CounterMetricFamily("tfdash_ingest_points_stored", "metric points the ingest stored (rate: ingest rate)")
    points.add_metric([], got[metrics_stream.POINTS_STORED])
    yield points
    entries = CounterMetricFamily(
        "tfdash_ingest_entries_handled",
        "metrics-stream entries the ingest handled (stored, or refused and counted; not dead letters)",
    )
    entries.add_metric([], got[metrics_stream.ENTRIES_HANDLED])
    yield entries
    dead = CounterMetricFamily("tfdash_dead_letters", "stream entries set aside as dead letters", labels=["kind"])
    for kind in broker.STREAM_KINDS:
        dead.add_metric([kind], got[streams.dead_letter_counter(kind)])
    yield dead
    refused = CounterMetricFamily(
        "tfdash_agent_messages_refused", "agent messages refused, by reason", labels=["reason"]
    )
    for reason, name in REFUSAL_REASONS.items():
        refused.add_metric([reason], got[name])
    yield refused
    count, total = readings.pass_time
    passes = SummaryMetricFamily("tfdash_scheduler_pass_seconds", "scheduler passes and their time")
    passes.add_metric([], count_value=count, sum_value=total)
    yield passes
    resent = CounterMetricFamily("tfdash_orders_resent", "launch and kill orders sent again (unanswered)")
    resent.add_metric([], got[reconcile.ORDERS_RESENT])
    yield resent
