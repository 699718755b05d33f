"""A process's competitor for one lease: a thread that takes or renews it every TFDASH_LEASE_RETRY_S, and
`acting()`, what the single actor asks before it acts.

`acting()` is judged by this process's monotonic clock from the moment it sent its last successful renewal: true for
TFDASH_LEASE_RENEW_DEADLINE_S after it. The database set the lease to end TFDASH_LEASE_S after it received that
statement (later still), so the holder stops acting at least LEASE - RENEW_DEADLINE (5 s) before anyone else may take
over, and does so by itself: a thread stuck on a database that went away, or a whole process paused, cannot make it
act on a lease it lost. (Like client-go's leaderelection, whose RenewDeadline is the same guard; its clock is the
holder's own, a rate, not a time of day, so skew between machines does not count.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import Error as DatabaseError
from django.db import close_old_connections, connection

from orchestrator.leases import store

log = logging.getLogger(__name__)

# The keepers running in this process, by lease name (the gate and the pass of one worker read the same one).
_RUNNING: dict[str, LeaseKeeper] = {}
_RUNNING_LOCK = threading.Lock()


class LeaseKeeper:
    def __init__(
        self,
        name: str,
        holder: str,
        *,
        duration_s: float | None = None,
        renew_deadline_s: float | None = None,
        retry_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.holder = holder
        self.duration_s = duration_s if duration_s is not None else settings.TFDASH_LEASE_S
        self.renew_deadline_s = (
            renew_deadline_s if renew_deadline_s is not None else settings.TFDASH_LEASE_RENEW_DEADLINE_S
        )
        self.retry_s = retry_s if retry_s is not None else settings.TFDASH_LEASE_RETRY_S
        if not 0 < self.retry_s < self.renew_deadline_s < self.duration_s:
            raise ValueError(f"lease {name}: need 0 < retry < renew deadline < duration")
        self.clock = clock
        self._valid_until = 0.0  # this process's clock; 0: not held
        self._held = False  # what the last answer said, for logging the changes
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acting(self) -> bool:
        """Whether this process holds the lease now and may act on it."""
        return self.clock() < self._valid_until

    def try_once(self) -> bool:
        """One attempt to take or renew; returns `acting()` after it. A database error changes nothing: the lease
        this process had lapses by itself at its renew deadline."""
        began = self.clock()
        try:
            close_old_connections()  # a connection a restarted PostgreSQL closed is not tried again
            held = store.take_or_renew(self.name, self.holder, self.duration_s)
        except DatabaseError as exc:
            if not self._failing:
                log.warning("lease %s: could not reach the database (%s); %s", self.name, exc,
                            "acting until the renew deadline" if self.acting() else "not acting")  # fmt: skip
            self._failing = True
            connection.close()
            return self.acting()
        self._failing = False
        if held:
            self._valid_until = began + self.renew_deadline_s
        else:
            self._valid_until = 0.0
        if held != self._held:
            log.warning("lease %s %s by %s", self.name, "taken" if held else "lost (held by another)", self.holder)
        self._held = held
        return self.acting()

    def start(self) -> LeaseKeeper:
        """Try at once (a lone control plane acts from its first second), then keep trying in a daemon thread."""
        self.try_once()
        self._thread = threading.Thread(target=self._run, name=f"lease-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.retry_s):
                self.try_once()
        finally:
            connection.close()  # this thread's own connection

    def stop(self, *, release: bool = True) -> None:
        """Stop competing; with `release`, hand the lease back if held, so a standby takes it at its next try."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.retry_s + store.STATEMENT_TIMEOUT_MS / 1000)
        was_acting = self.acting()
        self._valid_until = 0.0
        if release and was_acting:
            try:
                if store.release(self.name, self.holder):
                    log.warning("lease %s handed back by %s", self.name, self.holder)
            except DatabaseError as exc:
                log.warning("lease %s: could not hand it back (%s); it expires by itself", self.name, exc)


def running(name: str) -> LeaseKeeper | None:
    """The keeper of `name` this process runs, if any (None: this process does not compete for it)."""
    with _RUNNING_LOCK:
        return _RUNNING.get(name)


def keep(name: str, role: str = "") -> LeaseKeeper:
    """This process's keeper of `name`, started on the first call (later calls, e.g. a consumer restarted after a
    broker outage, get the same one)."""
    with _RUNNING_LOCK:
        keeper = _RUNNING.get(name)
        if keeper is None:
            keeper = _RUNNING[name] = LeaseKeeper(name, store.identity(role)).start()
        return keeper


def stop(name: str) -> None:
    """Stop this process's keeper of `name` and hand its lease back (a clean shutdown)."""
    with _RUNNING_LOCK:
        keeper = _RUNNING.pop(name, None)
    if keeper is not None:
        keeper.stop(release=True)
