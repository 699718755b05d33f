"""The lease rows: take or renew, hand back, read. Each statement is one round trip that decides by PostgreSQL's
`clock_timestamp()`, so the workers' clocks never matter (a worker whose clock is minutes off neither steals a live
lease nor keeps a dead one), and it holds inside a transaction too (`now()` would be the transaction's start)."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from orchestrator.models import ControlLease

BEAT = "beat"
SCHEDULER = "scheduler"
NAMES = (BEAT, SCHEDULER)
_TABLE = ControlLease._meta.db_table
# A statement of a lease never waits for long: its caller retries on its own period (TFDASH_LEASE_RETRY_S).
STATEMENT_TIMEOUT_MS = 3000

# Taken when free or expired, renewed when held by the caller; otherwise nothing changes and no row comes back.
_TAKE_SQL = f"""
    WITH t AS (SELECT clock_timestamp() AS now)
    INSERT INTO {_TABLE} AS l (name, holder, acquired_at, renewed_at, expires_at, transitions)
    SELECT %(name)s, %(holder)s, t.now, t.now, t.now + make_interval(secs => %(duration)s), 0 FROM t
    ON CONFLICT (name) DO UPDATE SET
        holder = EXCLUDED.holder,
        acquired_at = CASE WHEN l.holder = EXCLUDED.holder THEN l.acquired_at ELSE EXCLUDED.acquired_at END,
        renewed_at = EXCLUDED.renewed_at,
        expires_at = EXCLUDED.expires_at,
        transitions = l.transitions + (l.holder <> EXCLUDED.holder)::int
    WHERE l.holder = EXCLUDED.holder OR l.expires_at <= EXCLUDED.renewed_at
    RETURNING l.acquired_at, l.expires_at, l.transitions
"""  # noqa: S608 - the model's table; values are parameters
# Handed back on a clean stop: expired now, so a standby takes it at its next try instead of after the lease's time.
_RELEASE_SQL = f"UPDATE {_TABLE} SET expires_at = clock_timestamp() WHERE name = %s AND holder = %s"  # noqa: S608
_READ_SQL = f"SELECT name, holder, acquired_at, expires_at, transitions, clock_timestamp() FROM {_TABLE}"  # noqa: S608


def identity(role: str = "") -> str:
    """Who a process is in a lease's `holder`: its name (a Celery node name such as scheduler@machine-a, or the
    machine's), pid and a nonce, so a restarted process with a recycled pid, or a second one started under the same
    name, is never taken for the holder."""
    return f"{role or socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"[-200:]


@dataclass(frozen=True)
class Held:
    """A lease as its statement left it (`now`: the database's clock then)."""

    name: str
    holder: str
    acquired_at: datetime
    expires_at: datetime
    transitions: int
    now: datetime

    @property
    def live(self) -> bool:
        return self.expires_at > self.now


def _bounded(sql: str, params: object) -> list[tuple]:
    """One statement under a short statement timeout (SET LOCAL: its own transaction, or the caller's)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
        cursor.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


def take_or_renew(name: str, holder: str, duration_s: float) -> bool:
    """Take the lease `name` for `holder` when it is free or expired, or renew it when `holder` has it: True when
    `holder` holds it for `duration_s` from now (the database's clock); False when another live holder has it."""
    if name not in NAMES:
        raise ValueError(f"no lease named {name!r} (one of {', '.join(NAMES)})")
    if not 0 < duration_s <= 3600:
        raise ValueError(f"a lease lasts between 0 and 3600 s, not {duration_s}")
    rows = _bounded(_TAKE_SQL, {"name": name, "holder": holder[:200], "duration": float(duration_s)})
    return bool(rows)


def release(name: str, holder: str) -> bool:
    """Hand the lease back if `holder` has it (a clean stop); True when it did."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
        cursor.execute(_RELEASE_SQL, [name, holder[:200]])
        return cursor.rowcount > 0


def read_all() -> list[Held]:
    """Every lease row, with the database's clock to judge them by."""
    with connection.cursor() as cursor:
        cursor.execute(_READ_SQL)
        return [Held(*row) for row in cursor.fetchall()]
