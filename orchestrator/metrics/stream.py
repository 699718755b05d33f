"""The ingest loop: reads agents' metric reports and log lines from the Redis Stream, stores them in bulk, acknowledges
them.

At-least-once, stored once: an entry is acknowledged (and deleted) only after its rows are committed, and storing is
idempotent, so a crash between commit and acknowledgement costs a re-read, never a duplicate or a loss. On start the
consumer first re-reads the entries it had read but not acknowledged (its pending list), then new ones.

One consumer, by design: point ids must grow in commit order (see protocol.METRICS_QUEUE), so a second ingest would
have to use another consumer name and would break that order. It survives what it cannot prevent:
- Redis restarted (without persistence the stream and group are gone): it reconnects, recreates the group from the
  stream's first entry, and reads what agents added since (they keep retrying while Redis is down);
- PostgreSQL unavailable: nothing is acknowledged; it retries the same entries with backoff;
- an entry it cannot store (not a report, too deep to parse, a row the database refuses, anything else that raises):
  it goes to the dead letters (`<stream>:dead`, capped, each field cut short, MACs and any token hidden), is
  acknowledged like the others, and is counted. Were it left pending, it would be read first again after every
  restart: a crash loop.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import redis
from django.db import DatabaseError, connection

from contracts.protocol import METRICS_GROUP, METRICS_QUEUE, read_stream_entry
from orchestrator import counters
from orchestrator.metrics import ingest

log = logging.getLogger(__name__)

READ_COUNT = 500
BLOCK_MS = 1000
MAX_BACKOFF_S = 2.0


def dead_letter_stream(stream: str) -> str:
    """Where the entries of `stream` that cannot be stored go."""
    return f"{stream}:dead"


DEAD_LETTERS = dead_letter_stream(METRICS_QUEUE)
DEAD_LETTERED = "metric_entries_dead_lettered"  # the counter
DEAD_LETTERS_MAXLEN = 10_000
DEAD_FIELD_BYTES = 4096  # what a dead letter keeps of each field: enough to see what it was, not a 10 MB copy
DEAD_MAX_FIELDS = 8
# No secret travels in an entry any more (a MAC is not one, but it need not be kept either); an old agent's token is
# hidden all the same. Also when the value was cut short.
_SECRETS = re.compile(rb'("(?:token|mac)"\s*:\s*")[^"]*')
_HOST = re.compile(rb'"host"\s*:\s*"([^"\\]{1,100})"')


def latest_dead_letters(client: redis.Redis, count: int = 5) -> list[dict[str, str]]:
    """The newest dead letters of the agents' stream first, fields decoded for display."""
    return [
        {key.decode(errors="replace"): value.decode(errors="replace") for key, value in fields.items()}
        for _entry_id, fields in client.xrevrange(DEAD_LETTERS, count=count)
    ]


class MetricsConsumer:
    def __init__(self, client: redis.Redis, *, consumer: str = "ingest", stream: str = METRICS_QUEUE) -> None:
        self.client = client
        self.consumer = consumer
        self.stream = stream
        self.dead_letters = dead_letter_stream(stream)
        self.stored = ingest.Stored()
        self.entries = 0
        self.dead = 0

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
            except Exception:
                # Not an entry's fault (those are dead-lettered in drain_once): the thread must not die of it.
                log.exception("the ingest failed; retrying in %.2f s", backoff)
                backlog = True
            else:
                continue
            stop.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def drain_once(self, *, backlog: bool = False, block_ms: int | None = None) -> int:
        """Read at most READ_COUNT entries (pending ones when `backlog`), store them, dead-letter those that fail,
        acknowledge them all; returns how many were read."""
        response = self.client.xreadgroup(
            METRICS_GROUP,
            self.consumer,
            {self.stream: "0" if backlog else ">"},
            count=READ_COUNT,
            block=None if backlog else block_ms,
        )
        entries: list[tuple[bytes, dict[bytes, bytes] | None]] = response[0][1] if response else []
        if not entries:
            return 0
        reports: list[tuple[str, Any]] = []
        report_fields: list[dict[bytes, bytes]] = []  # the entry of each report
        dead: list[tuple[dict[bytes, bytes], Exception]] = []
        for entry_id, fields in entries:
            if not fields:  # deleted after it was read (acknowledged elsewhere): nothing left to store
                continue
            try:
                reports.append(read_stream_entry(fields))
            except Exception as exc:
                log.warning("stream entry %s is not a report: %s", entry_id.decode(errors="replace"), _text(exc))
                dead.append((fields, exc))
                continue
            report_fields.append(fields)
        stored = ingest.store_reports(reports)
        dead += [(report_fields[index], exc) for index, exc in stored.failed]
        for field in ("points", "samples", "artifacts", "dropped", "lines"):
            setattr(self.stored, field, getattr(self.stored, field) + getattr(stored, field))
        ids = [entry_id for entry_id, _fields in entries]
        # One MULTI: an entry is never both dead-lettered and still pending, nor acknowledged and lost.
        pipe = self.client.pipeline(transaction=True)
        for fields, exc in dead:
            pipe.xadd(self.dead_letters, _dead_letter(fields, exc), maxlen=DEAD_LETTERS_MAXLEN, approximate=True)
        pipe.xack(self.stream, METRICS_GROUP, *ids)
        pipe.xdel(self.stream, *ids)
        pipe.execute()
        for _ in dead:
            counters.incr(DEAD_LETTERED)
        self.dead += len(dead)
        self.entries += len(entries)
        return len(entries)


def _dead_letter(fields: dict[bytes, bytes], exc: Exception) -> dict[bytes, bytes | str]:
    """What the dead letters keep of an entry: a bounded prefix of its first fields with any MAC or token hidden, the
    host it names when that can be seen, why it failed and when."""
    letter: dict[bytes, bytes | str] = {}
    for key, value in list(fields.items())[:DEAD_MAX_FIELDS]:
        letter[key[:100]] = _SECRETS.sub(rb"\1<hidden>", value[:DEAD_FIELD_BYTES])
    host = _HOST.search(fields.get(b"envelope", b"")[:DEAD_FIELD_BYTES])
    letter[b"host"] = host.group(1) if host else b""
    letter[b"size"] = str(len(fields.get(b"envelope", b"")))
    letter[b"error"] = _text(exc)
    letter[b"at"] = f"{time.time():.3f}"
    return letter


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:500]}"
