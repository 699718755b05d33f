"""Celery beat's scheduler, sending only while its process holds the `beat` lease (settings.CELERY_BEAT_SCHEDULER).

Every control plane runs a beat (embedded in its orchestrator worker, `-B`); the one holding the lease sends the
watchdog ticks, rollups, retention and webhook sweeps, the others tick without sending. A standby that takes over
finds every entry due and sends each once (all are idempotent and expire), then keeps the schedule. Each beat keeps
its own schedule file, as before.
"""

from __future__ import annotations

import socket
from typing import Any

from celery.beat import PersistentScheduler

from orchestrator.leases import keeper, store

# A standby beat looks this often whether its keeper won the lease (a look costs no query), so it sends within this
# much of the takeover.
STANDBY_TICK_S = 0.5


class LeasedScheduler(PersistentScheduler):
    def setup_schedule(self) -> None:
        super().setup_schedule()
        # In the process that runs beat (the embedded beat's own child process): its thread, its connection.
        self.lease = keeper.keep(store.BEAT, role=f"beat@{socket.gethostname()}")

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self.lease.acting():
            return min(STANDBY_TICK_S, self.max_interval)
        return super().tick(*args, **kwargs)

    def close(self) -> None:
        super().close()
        keeper.stop(store.BEAT)
