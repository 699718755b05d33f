"""Which orders this agent may carry out: signed by the control plane it pins, for this host and this kind, fresh,
and never seen before, across its own restarts too.

Seen order ids are kept in `<workdir>/seen-orders.json` (written atomically, mode 0600) with the time each may be
forgotten: when it turns stale by the same clock that checks freshness (`issued_at + max_age`), since a stale order
is refused anyway. So the file holds at most the orders of one freshness window, and only orders signed by the
control plane can add to it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from contracts import signing
from worker_agent import atomic

log = logging.getLogger(__name__)

SEEN_FILE = "seen-orders.json"


class SeenOrders:
    """Order ids seen within the freshness window, persisted in the agent's workdir."""

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / SEEN_FILE
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}  # order id -> when it may be forgotten (wall seconds)
        try:
            loaded = json.loads(self.path.read_text())
            self._seen = {str(k): float(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            # Unreadable: refuse nothing wrongly remembered, but say so. Orders seen before it was lost are within
            # one freshness window of now only if the file broke in that window.
            log.warning("%s unreadable (%s): starting with no seen orders", self.path, exc)

    def first_time(self, order_id: str, forget_at: float, *, now: float | None = None) -> bool:
        """Record `order_id`; False when it was seen before (a replay). Written to disk before it is acted on."""
        now = time.time() if now is None else now
        with self._lock:
            if order_id in self._seen:
                return False
            self._seen = {key: at for key, at in self._seen.items() if at > now}
            self._seen[order_id] = forget_at
            self._save()
            return True

    def __len__(self) -> int:
        return len(self._seen)

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(self.path, self._seen)


class OrderGate:
    """Checks every order before the agent acts on it (see the module's doc)."""

    def __init__(
        self,
        control_key: Ed25519PublicKey,
        host: str,
        workdir: Path,
        *,
        max_age_s: float = signing.ORDER_MAX_AGE_S,
        max_skew_s: float = signing.MAX_CLOCK_SKEW_S,
    ) -> None:
        self.control_key = control_key
        self.host = host
        self.max_age_s = max_age_s
        self.max_skew_s = max_skew_s
        self.seen = SeenOrders(workdir)

    def admit(self, message: Any, kind: str) -> dict[str, Any]:
        """The body of an order this agent may carry out, or signing.Refused."""
        order = signing.open_order(
            message, self.control_key, self.host, kind, max_age_s=self.max_age_s, max_skew_s=self.max_skew_s
        )
        if not self.seen.first_time(order.order_id, order.issued_at + self.max_age_s):
            raise signing.Refused(signing.REPLAYED, f"order {order.order_id} was seen before")
        return order.body
