"""A worker's chores at start that need the database or Redis: done now, or, during an outage, retried in the
background until they are done. A process may start (a supervisor's restart, a machine's boot) while either is away,
and a chore that failed once must not be skipped for the rest of its life, nor hold up what does not need it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connections

from orchestrator.plumbing.outages import TRANSIENT

log = logging.getLogger(__name__)

FIRST_WAIT_S = 0.5
LONGEST_WAIT_S = 10.0


def retried(what: str, chore: Callable[[], object]) -> None:
    """Run `chore` now; when an outage stops it, again in a daemon thread, waiting FIRST_WAIT_S and then twice as
    long each time (at most LONGEST_WAIT_S), until it is done. Anything but an outage is a bug, logged with its
    traceback and not retried (it would fail the same way)."""
    if _stopped_by_outage(what, chore, first=True):
        threading.Thread(target=_until_done, args=(what, chore), name=f"start-up: {what}", daemon=True).start()


def _until_done(what: str, chore: Callable[[], object]) -> None:
    wait = FIRST_WAIT_S
    try:
        while True:
            time.sleep(wait)
            wait = min(wait * 2, LONGEST_WAIT_S)
            if not _stopped_by_outage(what, chore, first=False, again_in=wait):
                return
    finally:
        connections.close_all()  # this thread's own connections


def _stopped_by_outage(what: str, chore: Callable[[], object], *, first: bool, again_in: float = 0.0) -> bool:
    """Run `chore` once; whether an outage stopped it (then it is to be tried again), said in the log either way."""
    try:
        chore()
    except TRANSIENT as exc:
        if first:
            log.warning("could not %s at start (%s); retrying in the background", what, exc)
        else:
            log.info("could not %s yet (%s); again in %.1f s", what, exc, again_in)
        return True
    except Exception:
        log.exception("could not %s%s", what, " at start" if first else "")
        return False
    if not first:
        log.warning("did %s after an outage at start", what)
    return False
