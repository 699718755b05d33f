"""Work done once the current transaction commits, at most once per transaction for the same work: the one helper
for callbacks that many writes of one transaction would otherwise queue many times (a scheduler pass's ask for its
cluster, a job page's hint).
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction


def once(callback: Callable[[], None], using: str | None = None) -> None:
    """`transaction.on_commit(callback, using)`, unless a callback equal to this one is already queued in the current
    transaction: that one runs after the same commit and covers this one (so `callback` should be a value with an
    equality, e.g. a frozen dataclass). Django drops a queued callback with the savepoint it was queued in when that
    savepoint rolls back, so a callback is never skipped for one that will not run. Outside a transaction it runs
    now, as on_commit does."""
    connection = transaction.get_connection(using)
    if connection.in_atomic_block and any(callback == queued for _sids, queued, _robust in connection.run_on_commit):
        return
    transaction.on_commit(callback, using=using)
