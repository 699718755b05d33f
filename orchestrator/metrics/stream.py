"""The ingest loop: reads agents' metric reports and log lines from the Redis Stream, stores them in bulk, acknowledges
them.

At-least-once, stored once: an entry is acknowledged (and deleted) only after its rows are committed, and storing is
idempotent, so a crash between commit and acknowledgement costs a re-read, never a duplicate or a loss. On start the
consumer first re-reads the entries it had read but not acknowledged (its pending list), then new ones.

One consumer, by design: point ids must grow in commit order (see protocol.METRICS_QUEUE), so a second ingest would
have to use another consumer name and would break that order. It survives what it cannot prevent:
- Redis restarted (without persistence the stream and group are gone): it reconnects, recreates the group from the
  stream's first entry, and reads what agents added since (they keep retrying while Redis is down);
- PostgreSQL unavailable: nothing is acknowledged; it retries the same entries with backoff.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import redis
from django.db import DatabaseError, connection

from contracts.protocol import METRICS_GROUP, METRICS_QUEUE
from orchestrator import counters
from orchestrator.agents import auth
from orchestrator.metrics import ingest

log = logging.getLogger(__name__)

READ_COUNT = 500
BLOCK_MS = 1000
MAX_BACKOFF_S = 2.0


class MetricsConsumer:
    def __init__(self, client: redis.Redis, *, consumer: str = "ingest", stream: str = METRICS_QUEUE) -> None:
        self.client = client
        self.consumer = consumer
        self.stream = stream
        self.stored = ingest.Stored()
        self.entries = 0

    def ensure_group(self) -> None:
        """Create the consumer group (and the stream) unless they exist; "0": entries already waiting are read too."""
        try:
            self.client.xgroup_create(self.stream, METRICS_GROUP, id="0", mkstream=True)
            log.info("created consumer group %s on %s", METRICS_GROUP, self.stream)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def run(self, stop: threading.Event) -> None:
        backlog = True  # first what this consumer read before and never acknowledged
        backoff = 0.05
        while not stop.is_set():
            try:
                if backlog:
                    self.ensure_group()
                handled = self.drain_once(backlog=backlog, block_ms=BLOCK_MS)
                if backlog and handled == 0:
                    backlog = False
                backoff = 0.05
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("Redis unavailable (%s); retrying in %.2f s", exc, backoff)
                backlog = True
            except redis.ResponseError as exc:
                backlog = True
                # NOGROUP: the group is gone; UNBLOCKED: the stream went away under a blocking read. Both are what a
                # Redis restart without persistence (or a flush) does: create the group again and go on.
                if "NOGROUP" in str(exc) or "UNBLOCKED" in str(exc):
                    log.warning("the metric stream or its group is gone (Redis restarted?): creating it again")
                    continue
                log.warning("Redis refused a stream command (%s); retrying in %.2f s", exc, backoff)
            except DatabaseError as exc:
                # Nothing was acknowledged: the same entries come back from the pending list once the database does.
                log.warning("database unavailable (%s); retrying in %.2f s", exc, backoff)
                connection.close()
                backlog = True
            else:
                continue
            stop.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def drain_once(self, *, backlog: bool = False, block_ms: int | None = None) -> int:
        """Read at most READ_COUNT entries (pending ones when `backlog`), store them, acknowledge them; returns how
        many were read."""
        response = self.client.xreadgroup(
            METRICS_GROUP,
            self.consumer,
            {self.stream: "0" if backlog else ">"},
            count=READ_COUNT,
            block=None if backlog else block_ms,
        )
        entries = response[0][1] if response else []
        if not entries:
            return 0
        reports = [report for entry_id, fields in entries if (report := _report(entry_id, fields)) is not None]
        stored = ingest.store_reports(reports)
        for field in ("points", "samples", "artifacts", "dropped", "lines"):
            setattr(self.stored, field, getattr(self.stored, field) + getattr(stored, field))
        ids = [entry_id for entry_id, _fields in entries]
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(self.stream, METRICS_GROUP, *ids)
        pipe.xdel(self.stream, *ids)
        pipe.execute()
        self.entries += len(entries)
        return len(entries)


def _report(entry_id: bytes, fields: dict[bytes, bytes] | None) -> tuple[str, Any] | None:
    if not fields:  # deleted after it was read (acknowledged elsewhere): nothing left to store
        return None
    try:
        return fields[b"name"].decode(), json.loads(fields[b"envelope"])
    except (KeyError, UnicodeDecodeError, ValueError):
        log.warning("dropped stream entry %s: not a report", entry_id.decode(errors="replace"))
        counters.incr(auth.MALFORMED)
        return None
