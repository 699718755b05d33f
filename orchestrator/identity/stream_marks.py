"""A host's stream entries are fresh when appended and appended once: what the ingest checks of an entry beyond its
MAC (orchestrator/identity/auth.py), so that a captured entry cannot be appended again later, or soon.

Fresh: an agent seals an entry as it sends it (worker_agent/outbox.py: a report held through a broker outage leaves
with a new timestamp), in the same round trip that appends it. So its age is measured against the time Redis gave
the entry (the milliseconds of its stream id: Redis' clock, on the control plane), not against the time the ingest
reads it: entries that wait in the stream while the ingest is down are still accepted when it comes back, and an
entry appended more than TFDASH_STREAM_MAX_AGE_S after it was sealed (config/settings.py) is refused. An id cannot be
made to look older: Redis refuses a new id at or below the stream's last one.

Appended once: one high-water mark per host (the id of the newest entry of its stream the ingest admitted, and that
entry's seal time and nonce), in one Redis hash, read for a run's hosts in one round trip and written in one. The
agent seals a host's entries in the order it appends them, so along a stream the seal times do not go down. An entry
with an id above the mark must be sealed later than the mark's (or at the same instant with another nonce); one that
is not is the bytes of an earlier entry appended again, refused and counted as replayed. An entry with an id at or
below the mark was appended before the mark's and is being read again (a crash before its acknowledgement, a reader
taking over a partition, a run stored one by one): admitted, and storing it again changes nothing. A nonce per entry,
remembered for the window, would do the same at one Redis write per entry; the mark costs one field per host.

What it does not cover: a host's agent whose clock steps back across a restart has its entries refused as replays
until its clock passes the mark (NTP slews a running clock; keep it running); two ingest processes reading one
host's stream at once (only while the partitions change) may each write their mark, and the older one can win for a
moment, letting a replay within that window through. Anyone holding the control plane's Redis credential can delete
the marks, or delete a host's stream and append an old entry again under an id of their choosing (at or below the
mark: taken as read again): they can already delay and drop the whole fleet's reports (README "Threat model").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import redis
from django.conf import settings

from contracts import signing

log = logging.getLogger(__name__)

MARKS_KEY = "tfdash:stream-marks"  # hash: host name -> "<ms>-<seq> <seal time> <nonce>"

EntryId = tuple[int, int]


def entry_id(raw: bytes | str) -> EntryId:
    """A stream id (`1700000000000-3`) as numbers, which compare in the stream's order."""
    text = raw.decode("ascii") if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def appended_at(raw: bytes | str) -> float:
    """When Redis appended the entry with this id (its clock, in seconds)."""
    return entry_id(raw)[0] / 1000.0


@dataclass(frozen=True)
class Mark:
    entry: EntryId
    ts: float
    nonce: str

    def text(self) -> str:
        return f"{self.entry[0]}-{self.entry[1]} {self.ts!r} {self.nonce}"

    @classmethod
    def parse(cls, raw: bytes | None) -> Mark | None:
        if raw is None:
            return None
        try:
            entry, ts, nonce = raw.decode("ascii").split(" ")
            return cls(entry_id(entry), float(ts), nonce)
        except (UnicodeDecodeError, ValueError):
            log.warning("unreadable stream mark %r: starting again from the next entry", raw[:100])
            return None


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)


class Marks:
    """The marks of the hosts of one run of entries: `admit` each entry as it is opened, then `save`."""

    def __init__(self, hosts: set[str], client: redis.Redis | None = None) -> None:
        self._client = client or _redis()
        names = sorted(hosts)
        values = self._client.hmget(MARKS_KEY, names) if names else []
        self._marks = {name: Mark.parse(value) for name, value in zip(names, values, strict=True)}
        self._moved: set[str] = set()

    def admit(self, host: str, raw_id: bytes | str, message: signing.Opened) -> signing.Refused | None:
        """None when the entry `raw_id` of `host`'s stream, sealed as `message`, is new or read again (its mark
        moves to it when it is the newest); the reason it is refused when it is an earlier entry appended again."""
        entry = entry_id(raw_id)
        mark = self._marks.get(host)
        if mark is not None and entry <= mark.entry:
            return None  # appended before the mark's entry: read again, and storing is idempotent
        if mark is not None and (message.ts < mark.ts or (message.ts == mark.ts and message.nonce == mark.nonce)):
            return signing.Refused(
                signing.REPLAYED,
                f"an entry of {host!r} sealed at {message.ts:.6f}, appended after one sealed at {mark.ts:.6f}",
            )
        self._marks[host] = Mark(entry, message.ts, message.nonce)
        self._moved.add(host)
        return None

    def save(self) -> None:
        """Write the marks that moved (one round trip)."""
        if self._moved:
            moved = {host: mark.text() for host in self._moved if (mark := self._marks.get(host)) is not None}
            self._client.hset(MARKS_KEY, mapping=moved)  # type: ignore[arg-type]
            self._moved.clear()


@dataclass(frozen=True)
class Appended:
    """Where a report came from: entry `entry` of host `host`'s stream, whose marks are `marks`."""

    host: str
    entry: bytes | str
    marks: Marks

    @property
    def at(self) -> float:
        return appended_at(self.entry)


def appended_entries(
    count: int, entries: Sequence[tuple[str, bytes | str]] | None
) -> tuple[list[Appended | None], Marks | None]:
    """For `count` reports, the entry each came in ((host, stream id) each, or None: reports handed over directly,
    all None), with the marks of their hosts read in one round trip (None when there are no entries)."""
    if entries is None:
        return [None] * count, None
    marks = Marks({host for host, _id in entries})
    return [Appended(host, raw_id, marks) for host, raw_id in entries], marks
