"""Waking a stream reader when a host adds to a stream of its kind, so an idle reader need not poll Redis many times a
second (streams.py: reads are Lua scripts, which cannot block).

Redis's keyspace notifications: with `notify-keyspace-events` holding `K` (the keyspace channel) and `t` (stream
commands), every XADD publishes the word `xadd` on `__keyspace@<db>__:<key>`. A bell subscribes to the pattern of
every host's stream of one kind (`tfdash:host:*:events`) and counts the adds it hears; a reader notes the count before
it reads and, when the read came back short, waits for the count to move. Only the key's name travels, never an
entry: what a reader is handed stays bounded by its script.

Pub/sub is at most once (a notification sent while the bell reconnects is lost), so a reader whose bell is live still
reads every SAFETY_S, and one whose bell is not live polls every `idle_s` as before: notifications off and this
user may not turn them on, or it may not look (a managed Redis without CONFIG) and has heard none yet. The bell turns
notifications on at each (re)connection (a Redis restarted without its configuration file has them off again), adding
its two flags to whatever is set, and looks again every CHECK_S.
"""

from __future__ import annotations

import collections
import logging
import threading

import redis

from contracts import broker

log = logging.getLogger(__name__)

FLAGS = "Kt"  # the keyspace channel, stream commands
SAFETY_S = 1.0  # a live bell's reader still reads this often: a lost notification delays an entry this long at most
LISTEN_S = 0.5  # the listener looks this often whether it is stopped (and its readers with it: it rings as it goes)
CHECK_S = 30.0  # how often a bell looks that notifications are still on (an operator may turn them off, or on)
MAX_BACKOFF_S = 5.0
HEARD = 64  # the last pub/sub messages a bell heard, (key, event), for tests and debugging


def enable_notifications(client: redis.Redis) -> bool | None:
    """Make sure Redis sends the keyspace notifications of stream commands: True when they are on (already, or turned
    on now), False when they are off and this client may not turn them on, None when it may not even look (a user
    without CONFIG: an operator may have set them, which the first notification heard will tell)."""
    try:
        current = str(client.config_get("notify-keyspace-events").get("notify-keyspace-events", ""))
    except redis.ResponseError:  # NOPERM, or CONFIG renamed away
        return None
    missing = "".join(flag for flag in FLAGS if flag not in current and not (flag == "t" and "A" in current))
    if not missing:
        return True
    try:
        client.config_set("notify-keyspace-events", current + missing)
    except redis.ResponseError:
        return False
    return True


class Doorbell:
    """Counts the XADDs to every host's `kind` stream (see the module's doc). `start` runs its listener."""

    def __init__(self, client: redis.Redis, kind: str) -> None:
        self.client = client
        self.kind = kind
        db = client.connection_pool.connection_kwargs.get("db", 0)
        self.pattern = f"__keyspace@{db}__:{broker.stream('*', kind)}"
        self.live = False
        self.heard: collections.deque[tuple[str, str]] = collections.deque(maxlen=HEARD)
        self._rings = 0
        self._added: set[str] = set()  # every stream that rang: one a reader does not know is a new host's
        self._changed = threading.Condition()
        self._warned = False

    # --- the readers' side --------------------------------------------------------------------------------------
    def rings(self) -> int:
        """The count to pass to `wait` (take it before reading)."""
        with self._changed:
            return self._rings

    def streams_added_to(self) -> set[str]:
        """Every stream an add was heard on (a host each: bounded by the hosts)."""
        with self._changed:
            return set(self._added)

    def wait(self, since: int, timeout: float) -> bool:
        """Until an add after `since` was heard, or `timeout`; True when one was."""
        with self._changed:
            return self._changed.wait_for(lambda: self._rings != since, timeout)

    # --- the listener -------------------------------------------------------------------------------------------
    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name=f"{self.kind}-doorbell", daemon=True)
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        backoff = 0.1
        while not stop.is_set():
            try:
                known = enable_notifications(self.client)
                if known is not False:
                    self._listen(stop, known_on=known is True)  # returns when stopped, or notifications went off
                    backoff = 0.1
                else:
                    self._warn("are off and this user may not turn them on")
                    stop.wait(CHECK_S)
                continue
            except (redis.RedisError, OSError) as exc:
                log.info("%s doorbell: Redis unavailable (%r); its readers poll until it is back", self.kind, exc)
            finally:
                self._set_live(False)
            stop.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _listen(self, stop: threading.Event, *, known_on: bool) -> None:
        """Until `stop`, or notifications found off (looked at every CHECK_S of quiet); raises Redis's errors. Live
        once subscribed where notifications are known to be on, else once one was heard."""
        if not known_on:
            self._warn("may be off (this user may not look): the readers poll until one is heard")
        pubsub = self.client.pubsub()
        try:
            pubsub.psubscribe(self.pattern)
            quiet = 0.0
            while not stop.is_set():
                message = pubsub.get_message(timeout=LISTEN_S)
                if message is None:
                    quiet += LISTEN_S
                    if quiet >= CHECK_S:
                        quiet = 0.0
                        if enable_notifications(self.client) is False:
                            return
                    continue
                if message["type"] == "psubscribe":  # also after redis-py reconnected by itself: a new Redis?
                    known = enable_notifications(self.client)
                    if known is False:
                        return
                    if known:
                        self._set_live(True)  # and a ring: what was added before the subscription is read now
                elif message["type"] == "pmessage":
                    key = message["channel"].decode(errors="replace").split(":", 1)[1]
                    event = message["data"].decode(errors="replace")
                    self.heard.append((key, event))
                    if not self.live:
                        self._set_live(True)
                    if event == "xadd":  # not the readers' own XDELs, nor group commands
                        self._ring(key)
        finally:
            pubsub.close()

    def _warn(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "Redis's keyspace notifications %s: the %s readers poll (set notify-keyspace-events to include %s to "
                "wake them on each add instead)", what, self.kind, FLAGS,
            )  # fmt: skip

    def _set_live(self, live: bool) -> None:
        self.live = live
        self._ring()  # a reader waiting on a bell that went away goes back to polling at once

    def _ring(self, key: str | None = None) -> None:
        with self._changed:
            self._rings += 1
            if key is not None:
                self._added.add(key)
            self._changed.notify_all()
