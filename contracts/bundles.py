"""Per-host bundles: what a host's tasks reported in a short interval, as one sealed entry of its METRICS stream.

A host running eight tasks that each report every second sent eight entries a second, each sealed (one HMAC) and
verified on its own, and each a round trip's share at both ends. The agent's outbox (worker_agent/outbox.py) now packs
the metric points, log lines and host samples waiting together (it lingers at most BUNDLE_LINGER_S for more) into one
HOST_REPORTS message: one MAC, one XADD, verified once by the ingest. Inside, the reports keep the order they were
made in, so each task's reports (and the sequence numbers of its log lines) stay in order. An artifact, which can be
large, still travels alone. `bundle_entries` is the one packing rule (the agent's outbox and bench/fleet_sim.py use it):
a run of reports too big for one entry is split until every part fits, and a lone report goes as itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contracts.protocol import HOST_SAMPLES, MAX_ENTRY_BYTES, TASK_LOGS, TASK_METRICS, stream_entry

HOST_REPORTS = "orchestrator.host_reports"
# The reports that may travel in a bundle (an artifact never does: it alone may weigh up to MAX_ARTIFACT_ENTRY_BYTES).
BUNDLED = frozenset({TASK_METRICS, TASK_LOGS, HOST_SAMPLES})
MAX_BUNDLE_REPORTS = 1000
# Below the entry bound with room to spare, so a bundle is never dead-lettered for its size.
MAX_BUNDLE_CHARS = MAX_ENTRY_BYTES - 64 * 1024
# How long the agent waits for more reports before it sends what it has (the live charts' budget, TF event to
# browser, is 50 ms at the median).
BUNDLE_LINGER_S = 0.02


@dataclass(frozen=True)
class HostReports:
    reports: list[Any]  # [name, body] pairs, in the order they were made


# seal(name, body) -> the sealed envelope, or None when the body cannot be sealed (it is then left out).
Seal = Callable[[str, Any], Any]


def bundle_entries(reports: list[tuple[str, Any]], seal: Seal) -> list[dict[str, str]]:
    """Stream entries carrying `reports` (all of them BUNDLED), in order: as few sealed HOST_REPORTS as keep each
    entry within MAX_BUNDLE_CHARS and MAX_BUNDLE_REPORTS; a report alone goes as itself."""
    entries: list[dict[str, str]] = []
    for start in range(0, len(reports), MAX_BUNDLE_REPORTS):
        _pack(reports[start : start + MAX_BUNDLE_REPORTS], seal, entries)
    return entries


def _pack(reports: list[tuple[str, Any]], seal: Seal, entries: list[dict[str, str]]) -> None:
    if len(reports) == 1:
        name, body = reports[0]
        envelope = seal(name, body)
        if envelope is not None:
            entries.append(stream_entry(name, envelope))
        return
    envelope = seal(HOST_REPORTS, {"reports": [[name, body] for name, body in reports]})
    entry = stream_entry(HOST_REPORTS, envelope) if envelope is not None else None
    if entry is not None and len(entry["envelope"]) <= MAX_BUNDLE_CHARS:
        entries.append(entry)
        return
    # Too big, or one body cannot be sealed: halves, down to single reports (only the bad one is then left out).
    half = len(reports) // 2
    _pack(reports[:half], seal, entries)
    _pack(reports[half:], seal, entries)
