"""The one reader of the hosts' Redis Streams: group set-up, claiming what a dead reader left, bounded reads, the
handler, acknowledgement after it returned, dead letters and backoff. The heartbeats, the events intake (hello and
task events) and the metric ingest each run one with a handler of their own.

Every host adds to streams of its own (contracts/broker.py), so a reader reads one kind of stream of every host: its
host list comes from the database, refreshed every few seconds, and a stream or group that does not exist yet (a new
host, a Redis restarted without persistence) is made when a read says so, from the stream's first entry.

Bounded before parsed: entries are read by a Lua script inside Redis that measures each one and hands back only
those within their bound (contracts/protocol.py MAX_ENTRY_BYTES; an artifact's may be larger): a 100 MB entry a host
added never reaches this process, it is dead-lettered unread. The same script hands back, unread, an entry that has
been delivered more than `max_deliveries` times without being acknowledged (a handler that kills its process every
time, say), and it dead-letters it too, so no entry can make a crash loop. Reads do not block (a blocking read would
return the entries themselves, of any size): a reader with `wake_on_add` waits for Redis to say that a host added to
a stream of its kind (doorbell.py: keyspace notifications, names only), others poll every `idle_s` while nothing
comes. A read has a byte budget (`read_bytes`, contracts/publish_limits.py READ_BYTES_BUDGET): once the entries it
measured weigh that much it asks for no more, so one read hands a reader at most the budget plus one entry, however
many a host queued. (Redis
has no command that sizes one entry without reading it: the script reads entries into its own memory, inside Redis,
one XREADGROUP at a time, and nothing over its bound ever leaves Redis. The agents bound what a task may add,
contracts/publish_limits.py, and Redis's `maxmemory` what all of them may.)

At least once: an entry is acknowledged (and deleted) only after the handler returned, in one transaction with the
dead letters of its batch. A handler that meets an outage (orchestrator/plumbing/outages.py: the database, Redis or
the broker away, a lock not had in time) is given the same batch again after a backoff, without reading it again:
a delivery is counted only when a reader died on its batch (or the handler raised anything else), so an outage never
dead-letters anything. A reader that starts again reads its pending entries first (once it knows the hosts' streams:
started during a database outage, it waits for the host list before its backlog read); entries delivered twice already
are read one at a time, so the one that kills the reader is the only one set aside. A handler returns the entries it
could not use, with the reason: those are dead-lettered. A reader whose process died leaves its pending entries to be
claimed by another reader of the same group after `claim_idle_ms` (when set); a reader that claimed any reads its
pending entries next.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import kombu.exceptions
import redis
from django.db import DatabaseError, connection

from contracts import broker, signing
from contracts.protocol import MAX_ARTIFACT_ENTRY_BYTES, MAX_ENTRY_BYTES, TASK_ARTIFACT, read_stream_entry
from contracts.publish_limits import READ_BYTES_BUDGET
from orchestrator.plumbing import counters, doorbell, stream_scripts
from orchestrator.plumbing.outages import TRANSIENT

# The database's part of the outages waited out with the same batch (a lock not had in time is one too); any other
# database error is a bug or bad input, counted against the batch's entries like any other failure.
DATABASE_OUTAGES = tuple(kind for kind in TRANSIENT if issubclass(kind, DatabaseError))

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 1.0  # Redis or the database back: reading resumes within a second
MANY_STREAMS = 1000  # streams per XREADGROUP of new entries (2 arguments each: Lua's unpack takes under 8,000)
HOSTS_REFRESH_S = 1.0  # a host registered a moment ago is read within a second
DEAD_LETTERS_MAXLEN = 10_000
DEAD_FIELD_BYTES = 4096  # what a dead letter keeps of each field: enough to see what it was, not a 10 MB copy
DEAD_MAX_FIELDS = 8
# No secret travels in an entry (a MAC is not one, but it need not be kept either); an old agent's token is hidden all
# the same, also when the value was cut short.
_SECRETS = re.compile(rb'("(?:token|mac)"\s*:\s*")[^"]*')


@dataclass(frozen=True)
class Entry:
    stream: str
    id: bytes
    fields: dict[bytes, bytes]

    @property
    def host(self) -> str:
        return broker.host_of_key(self.stream)


# A handler gets the batch's entries that are within bounds and returns those it could not use, with why; it raises
# (a database or Redis error) to have the whole batch read again later.
Handler = Callable[[list[Entry]], list[tuple[Entry, Exception]]]


def all_host_names() -> list[str]:
    from orchestrator.models import Host  # noqa: PLC0415 - the app registry is ready only once a reader runs

    return list(Host.objects.order_by("pk").values_list("name", flat=True))


def dead_letter_stream(kind: str) -> str:
    """Where the entries of the hosts' `kind` streams that cannot be used go (control plane only)."""
    return f"tfdash:{kind}:dead"


def dead_letter_counter(kind: str) -> str:
    return f"{kind}_entries_dead_lettered"


def latest_dead_letters(client: redis.Redis, kind: str, count: int = 5) -> list[dict[str, str]]:
    """The newest dead letters of the hosts' `kind` streams first, fields decoded for display."""
    return [
        {key.decode(errors="replace"): value.decode(errors="replace") for key, value in fields.items()}
        for _entry_id, fields in client.xrevrange(dead_letter_stream(kind), count=count)
    ]


def streams_of(kind: str, hosts: Iterable[str]) -> list[str]:
    return [broker.stream(host, kind) for host in hosts]


def oldest_waiting_age_s(client: redis.Redis, kind: str, group: str, hosts: Iterable[str]) -> float:
    """How long the oldest entry of the hosts' `kind` streams that `group` has not finished with (read and not
    acknowledged, or not read at all) has been waiting; 0.0 when none waits. On Redis's clock, which stamped them."""
    keys = streams_of(kind, hosts)
    if not keys:
        return 0.0
    oldest = client.eval(stream_scripts.OLDEST_WAITING, len(keys), *keys, group)
    if not oldest:
        return 0.0
    seconds, micros = client.time()
    return max(0.0, (int(seconds) * 1000 + int(micros) // 1000 - int(oldest)) / 1000)


@dataclass
class StreamReader:
    """One consumer (`consumer`) in `group` of every host's `kind` stream (see the module's doc)."""

    client: redis.Redis
    kind: str
    group: str
    consumer: str
    handler: Handler
    hosts: Callable[[], Iterable[str]] = all_host_names
    read_count: int = 500  # entries per read, over all streams
    per_stream: int = 500
    max_entry_bytes: int = MAX_ENTRY_BYTES
    big_name: str = TASK_ARTIFACT
    big_entry_bytes: int = MAX_ARTIFACT_ENTRY_BYTES
    max_deliveries: int = 5
    read_bytes: int = READ_BYTES_BUDGET  # what one read hands over at most, one entry past it (publish_limits.py)
    idle_s: float = 0.05  # the pause after a read that was not full (without a live doorbell)
    # Woken by the hosts' adds (orchestrator/plumbing/doorbell.py) instead of polling every idle_s while quiet.
    wake_on_add: bool = False
    bell: doorbell.Doorbell | None = field(default=None, init=False, repr=False)  # while it runs, with wake_on_add
    claim_idle_ms: int | None = None
    claim_every_s: float = 5.0
    entries: int = 0
    dead: int = 0
    _streams: list[str] = field(default_factory=list)
    _hosts_at: float = -1e9
    _hosts_read: bool = False  # a host list was read at least once
    _looked_up: set[str] = field(default_factory=set)  # streams that rang unknown and made the host list be read
    _repaired: bool = False  # the last read made a missing group
    _next_claim: float = 0.0
    _offset: int = 0
    _scripts: dict[str, Any] = field(default_factory=dict)
    # A batch read whose handling met an outage: handed over again before anything new is read.
    _unfinished: tuple[list[tuple[str, bytes]], list[Entry], list[tuple[Entry, str]]] | None = None

    # --- the loop -------------------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        backlog = True  # first what this consumer read before and never acknowledged
        backoff = 0.05
        bell = self.bell = doorbell.Doorbell(self.client, self.kind) if self.wake_on_add else None
        if bell is not None:
            bell.start(stop)
        while not stop.is_set():
            rung = bell.rings() if bell is not None else 0  # before the read: an add during it is not waited for
            try:
                if self.claim_idle_ms is not None and (backlog or time.monotonic() >= self._next_claim):
                    # What it took over is this consumer's pending now, which only a backlog read reads.
                    backlog = self.take_over_abandoned() > 0 or backlog
                handled = self.drain_once(backlog=backlog)
                if backlog and handled == 0:
                    backlog = False
                backoff = 0.05
                if self._repaired:
                    self._repaired = False
                elif not backlog and handled < self.read_count:
                    if bell is None:
                        stop.wait(self.idle_s)
                    # A bell that goes live rings too: the reader stops polling at once.
                    elif bell.wait(rung, doorbell.SAFETY_S if bell.live else self.idle_s):
                        self._notice_new_hosts(bell)
                continue
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("%s reader: Redis unavailable (%s); retrying in %.2f s", self.kind, exc, backoff)
            except DATABASE_OUTAGES as exc:
                # Nothing was acknowledged: the same batch is handed over again once the database is back.
                log.warning("%s reader: database unavailable (%s); retrying in %.2f s", self.kind, exc, backoff)
                connection.close()
            except kombu.exceptions.OperationalError as exc:
                log.warning("%s reader: the broker refused (%s); retrying in %.2f s", self.kind, exc, backoff)
            except redis.ResponseError as exc:
                self._unfinished = None
                log.warning("%s reader: Redis refused a command (%s); retrying in %.2f s", self.kind, exc, backoff)
            except Exception as exc:
                # Not an outage (orchestrator/plumbing/outages.py): the batch is read again, and counted, as after a
                # crash (an entry that always fails this way is set aside after max_deliveries).
                self._unfinished = None
                if isinstance(exc, DatabaseError):
                    connection.close()
                log.exception("%s reader failed; retrying in %.2f s", self.kind, backoff)
            backlog = True
            stop.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        connection.close()

    def streams(self) -> list[str]:
        """Every host's stream of this kind (the host list read again every HOSTS_REFRESH_S). Raises the database's
        error while no list was ever read: a reader started during an outage that went on with none would end its
        backlog read at once (nothing to read) and never read the entries it had left pending before it restarted."""
        if time.monotonic() - self._hosts_at >= HOSTS_REFRESH_S:
            try:
                self._streams = streams_of(self.kind, self.hosts())
                self._hosts_at = time.monotonic()
                self._hosts_read = True
            except DatabaseError as exc:
                connection.close()
                if not self._hosts_read:
                    raise
                log.warning("%s reader: cannot read the host list (%s); using the last one", self.kind, exc)
        return self._streams

    def ensure_groups(self) -> None:
        """Make the group on every stream that lacks it (a read would too, on its first try), from its start."""
        for stream in self.streams():
            self._repair(stream, "NOGROUP")

    def _notice_new_hosts(self, bell: doorbell.Doorbell) -> None:
        """A stream that rang and is not among this reader's is a host registered since its host list was read: read
        the list again now, not at the next refresh (a new agent's hello is then applied before its heartbeats mark
        it online). Once per such stream: one of a host the database does not know waits for the refresh."""
        unknown = bell.streams_added_to() - set(self._streams) - self._looked_up
        if unknown:
            self._looked_up |= unknown
            self.forget_hosts()

    def forget_hosts(self) -> None:
        """Read the host list again before the next read (tests, a host just registered)."""
        self._hosts_at = -1e9

    def take_over_abandoned(self) -> int:
        """Claim what readers of the group (this one before a restart among them) read and never acknowledged for
        `claim_idle_ms` (a worker that died for good); returns how many entries it claimed."""
        self._next_claim = time.monotonic() + self.claim_every_s
        keys = self.streams()
        if not keys or self.claim_idle_ms is None:
            return 0
        claimed = self._script(stream_scripts.CLAIM)(
            keys=keys, args=[self.group, self.consumer, self.claim_idle_ms, self.per_stream]
        )
        return int(claimed or 0)

    def drain_once(self, *, backlog: bool = False) -> int:
        """Read up to `read_count` entries (this consumer's pending ones when `backlog`), hand those within bounds to
        the handler, dead-letter the rest and what the handler refused, acknowledge and delete them all; returns how
        many were read. A batch whose handling met an outage (OUTAGES) is kept and handed over again first."""
        if self._unfinished is None:
            batch = self._read(backlog)
            if batch is None:
                return 0
            self._unfinished = batch
        read, good, dead = self._unfinished
        refused = self.handler(good) if good else []
        self._finish(read, dead + [(entry, _text(exc)) for entry, exc in refused])
        self._unfinished = None
        self.entries += len(read)
        return len(read)

    def _read(self, backlog: bool) -> tuple[list[tuple[str, bytes]], list[Entry], list[tuple[Entry, str]]] | None:
        keys = self.streams()
        if not keys:
            return None
        # Start at another stream each time, so a busy host cannot keep the ones after it waiting.
        self._offset = (self._offset + 1) % len(keys)
        keys = keys[self._offset :] + keys[: self._offset]
        rows = self._script(stream_scripts.READ)(
            keys=keys,
            args=[self.group, self.consumer, "0" if backlog else ">", self.per_stream, self.read_count,
                  self.max_entry_bytes, self.big_name, self.big_entry_bytes, self.max_deliveries, MANY_STREAMS,
                  self.read_bytes],
        )  # fmt: skip
        read: list[tuple[str, bytes]] = []
        good: list[Entry] = []
        dead: list[tuple[Entry, str]] = []
        for row in rows:
            stream = row[0].decode()
            if row[1] == b"error":
                self._repair(stream, row[2].decode(errors="replace"))
                continue
            entry_id, verdict = row[1], row[2]
            read.append((stream, entry_id))
            if verdict == b"ok":
                flat = row[3]
                good.append(Entry(stream, entry_id, dict(zip(flat[::2], flat[1::2], strict=True))))
            elif verdict == b"size":
                dead.append((Entry(stream, entry_id, {}), f"{row[3]} bytes, over the bound for its kind"))
            elif verdict == b"tries":
                dead.append((Entry(stream, entry_id, {}), f"delivered {row[3]} times and never acknowledged"))
        return (read, good, dead) if read else None

    # --- helpers --------------------------------------------------------------------------------------------------
    def _finish(self, read: list[tuple[str, bytes]], dead: list[tuple[Entry, str]]) -> None:
        """One MULTI: an entry is never both dead-lettered and still pending, nor acknowledged and lost, and the dead
        letters are counted with them (counted after, a reader of the drained stream could see one not yet counted).
        The stream's client is the counters' Redis (both REDIS_URL)."""
        by_stream: dict[str, list[bytes]] = {}
        for stream, entry_id in read:
            by_stream.setdefault(stream, []).append(entry_id)
        try:
            self._acknowledge(by_stream, dead, letters=True)
        except redis.exceptions.OutOfMemoryError:
            # Redis is full (maxmemory, `noeviction`: contracts/publish_limits.py) and refuses the dead letters'
            # XADD, and with it the whole MULTI. Acknowledging and deleting are what frees it: done without the
            # letters, which are logged here only, or nothing would ever drain again.
            log.warning("%s reader: Redis is full; %d dead letter(s) logged only", self.kind, len(dead))
            self._acknowledge(by_stream, dead, letters=False)
        for entry, why in dead:
            log.warning("%s entry %s of host %s dead-lettered: %s", self.kind, entry.id.decode(), entry.host, why)
        self.dead += len(dead)

    def _acknowledge(self, by_stream: dict[str, list[bytes]], dead: list[tuple[Entry, str]], *, letters: bool) -> None:
        pipe = self.client.pipeline(transaction=True)
        for entry, why in dead if letters else ():
            pipe.xadd(dead_letter_stream(self.kind), _dead_letter(entry, why), maxlen=DEAD_LETTERS_MAXLEN,
                      approximate=True)  # fmt: skip
        if dead and letters:
            pipe.incrby(counters.key(dead_letter_counter(self.kind)), len(dead))
        for stream, ids in by_stream.items():
            pipe.xack(stream, self.group, *ids)
            pipe.xdel(stream, *ids)
        pipe.execute()

    def _repair(self, stream: str, error: str) -> None:
        if "NOGROUP" in error:
            # A new host, or Redis lost the group (a restart without persistence): from the stream's start, since
            # every entry a host added meanwhile is news (a stale one is refused when applied).
            try:
                self.client.xgroup_create(stream, self.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._repaired = True  # read again before any pause: its entries are there now
        else:
            log.warning("%s reader: reading %s failed: %s", self.kind, stream, error)

    def _script(self, source: str) -> Any:
        if source not in self._scripts:
            self._scripts[source] = self.client.register_script(source)
        return self._scripts[source]


def _dead_letter(entry: Entry, why: str) -> dict[bytes, bytes | str]:
    """What the dead letters keep of an entry: a bounded prefix of its first fields with any MAC or token hidden (none
    when it was not read: too big, or delivered too often), its host, why and when."""
    letter: dict[bytes, bytes | str] = {}
    for key, value in list(entry.fields.items())[:DEAD_MAX_FIELDS]:
        letter[key[:100]] = _SECRETS.sub(rb"\1<hidden>", value[:DEAD_FIELD_BYTES])
    letter[b"host"] = entry.host
    letter[b"stream_id"] = entry.id
    if entry.fields:
        letter[b"size"] = str(sum(len(k) + len(v) for k, v in entry.fields.items()))
    letter[b"error"] = why
    letter[b"at"] = f"{time.time():.3f}"
    return letter


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:500]}"


_started: dict[str, tuple[threading.Thread, threading.Event]] = {}


def start(reader: StreamReader) -> threading.Event:
    """Run `reader` in a daemon thread of this process (once per kind and consumer); set the returned event to stop
    it."""
    name = f"{reader.kind}-{reader.consumer}"
    if name in _started:
        return _started[name][1]
    stop = threading.Event()
    thread = threading.Thread(target=reader.run, args=(stop,), name=name, daemon=True)
    thread.start()
    _started[name] = (thread, stop)
    log.info("%s reader %s started", reader.kind, reader.consumer)
    return stop


def read_entry(entry: Entry) -> tuple[str, Any]:
    """(name, sealed envelope) of a host's stream entry; raises (KeyError, ValueError, RecursionError) when it is not
    one, or when the envelope names another host than the stream's: a host speaks only for itself, on its own streams,
    so another host's (replayed) message there is refused before anyone looks at its body."""
    name, envelope = read_stream_entry(entry.fields)
    try:
        sender = signing.envelope_host(envelope)
    except signing.Refused:
        return name, envelope  # not an envelope at all: the handler refuses it as its check does (logged, counted)
    if sender != entry.host:
        raise ValueError(f"a message of host {sender[:100]!r} on the stream of host {entry.host!r}")
    return name, envelope
