"""The ingest: the reader of every host's METRICS stream (metric points, log lines, host samples, artifacts), storing
them in bulk (orchestrator/metrics/ingest.py) on the shared stream reader (orchestrator/plumbing/streams.py).

At-least-once, stored once: an entry is acknowledged (and deleted) only after its rows are committed, and storing is
idempotent, so a crash between commit and acknowledgement costs a re-read, never a duplicate or a loss. On start the
consumer first re-reads the entries it had read but not acknowledged (its pending list), then new ones.

More than one, in partitions: the consumer of partition P of N reads the streams of the hosts that
contracts/protocol.py `ingest_partition` gives P (one process each, N = TFDASH_INGEST_PARTITIONS), each a consumer
of its own name in the one group. Two partitions may store points of one job (its tasks on hosts of both): a job's
points are numbered from its counter row, locked until the commit, so the browser's cursor (POINT_SEQ) still grows in
commit order. When N changes, a host's stream may move to another partition: what the old reader had read and not
acknowledged is claimed by the new one after CLAIM_IDLE_MS. It survives what it cannot prevent:
- Redis restarted (without persistence the streams and groups are gone): it makes each group again from the stream's
  first entry, and reads what agents added since (they keep retrying while Redis is down);
- PostgreSQL unavailable: nothing is acknowledged; it retries the same entries with backoff;
- an entry it cannot store (too big to read, not a report, sealed by another host than the stream's, too deep to
  parse, a row the database refuses, anything else that raises, or one delivered again and again): it goes to the dead
  letters (`tfdash:metrics:dead`, capped, each field cut short, MACs and any token hidden), is acknowledged like the
  others, and is counted. Were it left pending, it would be read first again after every restart: a crash loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import redis
from django.conf import settings

from contracts import broker
from contracts.protocol import METRICS_GROUP, ingest_partition
from orchestrator.metrics import ingest
from orchestrator.plumbing import counters, streams

READ_COUNT = 500
# Entries another consumer read and left this long (it died, or the partitions changed) are taken over.
CLAIM_IDLE_MS = 30_000
# Between reads that came back short, when Redis's keyspace notifications are off (with them on, an add wakes the
# reader: orchestrator/plumbing/doorbell.py): the latency a point adds waiting here, at most (the live pages' budget
# is 50 ms at the median, TF event to browser).
IDLE_S = 0.02

DEAD_LETTERS = streams.dead_letter_stream(broker.METRICS)
DEAD_LETTERED = streams.dead_letter_counter(broker.METRICS)  # the counter
# What the ingest stored, counted once per batch (GET /metrics: their rate is the ingest rate).
POINTS_STORED = "ingest_points_stored"
ENTRIES_HANDLED = "ingest_entries_handled"


def waiting_age_s(client: redis.Redis, host_names: Iterable[str] | None = None) -> float:
    """How long the oldest metric-stream entry not stored yet has waited (0.0 when none waits), over every host."""
    hosts = list(host_names) if host_names is not None else streams.all_host_names()
    return streams.oldest_waiting_age_s(client, broker.METRICS, METRICS_GROUP, hosts)


def behind(waiting_s: float) -> bool:
    """Whether the ingest is behind (TFDASH_INGEST_BEHIND_S): the one rule of the cluster page and of /metrics."""
    return waiting_s > settings.TFDASH_INGEST_BEHIND_S


def latest_dead_letters(client: redis.Redis, count: int = 5) -> list[dict[str, str]]:
    """The newest dead letters of the hosts' metric streams first, fields decoded for display."""
    return streams.latest_dead_letters(client, broker.METRICS, count)


class MetricsConsumer:
    """The ingest's reader (see the module's doc); `hosts`: whose streams it reads (default every registered host)."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        consumer: str = "ingest",
        hosts: Callable[[], Iterable[str]] | None = None,
        partition: int = 0,
        partitions: int = 1,
    ) -> None:
        """`partition` of `partitions`: read only the streams of the hosts that partition is given."""
        self.stored = ingest.Stored()
        every = hosts or streams.all_host_names

        def mine() -> list[str]:
            return [host for host in every() if ingest_partition(host, partitions) == partition]

        self.reader = streams.StreamReader(
            client,
            kind=broker.METRICS,
            group=METRICS_GROUP,
            consumer=consumer,
            handler=self._store,
            hosts=mine,
            read_count=READ_COUNT,
            per_stream=READ_COUNT,
            idle_s=IDLE_S,
            wake_on_add=True,
            claim_idle_ms=CLAIM_IDLE_MS,
        )

    @property
    def entries(self) -> int:
        return self.reader.entries

    @property
    def dead(self) -> int:
        return self.reader.dead

    def run(self, stop: threading.Event) -> None:
        self.reader.run(stop)

    def drain_once(self, *, backlog: bool = False) -> int:
        return self.reader.drain_once(backlog=backlog)

    def _store(self, entries: list[streams.Entry]) -> list[tuple[streams.Entry, Exception]]:
        refused: list[tuple[streams.Entry, Exception]] = []
        reports = []
        stored_from: list[streams.Entry] = []  # the entry of each report
        for entry in entries:
            try:
                reports.append(streams.read_entry(entry))
            except Exception as exc:
                refused.append((entry, exc))
                continue
            stored_from.append(entry)
        # Each report's entry: its age is measured to its append, and an entry appended again is refused.
        stored = ingest.store_reports(reports, [(entry.host, entry.id) for entry in stored_from])
        refused += [(stored_from[index], exc) for index, exc in stored.failed]
        for name in ("points", "samples", "artifacts", "dropped", "lines"):
            setattr(self.stored, name, getattr(self.stored, name) + getattr(stored, name))
        counters.incr(POINTS_STORED, stored.points)
        counters.incr(ENTRIES_HANDLED, len(entries) - len(refused))
        return refused
