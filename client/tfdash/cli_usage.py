"""`tfdash usage`: device-hours per account for a period of UTC days (GET /api/usage/), as a table of each account's
totals (per device kind, device-seconds, running, the showback cost when a cluster has a price), or --json; --daily
adds the per-day rows."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rich.markup import escape
from rich.table import Table

from tfdash.cli_output import _json, out
from tfdash.client import Client
from tfdash.exit_codes import OK
from tfdash.terminal import printable


def _hours(seconds: Any) -> str:
    return f"{float(seconds or 0) / 3600:.2f}"


def usage(ns: argparse.Namespace, client: Callable[[], Client]) -> int:
    with client() as api:
        body = api.usage(start=ns.start, end=ns.end, by=ns.by, user=ns.user, group=ns.group, cluster=ns.cluster)
    if ns.json:
        _json(body)
        return OK
    accounts = [a for a in body.get("accounts", []) if isinstance(a, dict)]
    kinds = sorted({kind for a in accounts for kind in a.get("by_kind", {})})
    priced = any(a.get("cost") is not None for a in accounts)
    period = f"{escape(str(body.get('from')))} to {escape(str(body.get('to')))} (UTC)"
    total = float(body.get("device_seconds") or 0)
    out.print(
        f"[bold]usage[/] {period}, per {escape(str(body.get('by')))}: "
        f"{total:.0f} device-seconds, {_hours(total)} device-hours"
    )
    table = Table(str(body.get("by", "account")), *(f"{k} hours" for k in kinds), "device-hours", "device-seconds",
                  "running s", *(["cost"] if priced else []), box=None)  # fmt: skip
    for a in accounts:
        cost = a.get("cost")
        table.add_row(
            escape(printable(str(a.get("account", "")))),
            *(_hours(a.get("by_kind", {}).get(k)) for k in kinds),
            _hours(a.get("device_seconds")),
            f"{float(a.get('device_seconds') or 0):.0f}",
            f"{float(a.get('running_seconds') or 0):.0f}",
            *([f"{cost:.2f}" if isinstance(cost, int | float) else "-"] if priced else []),
        )
    out.print(table)
    if ns.daily:
        daily = Table("day", str(body.get("by", "account")), "kind", "device-hours", "device-seconds", box=None)
        days = [row for row in body.get("days", []) if isinstance(row, dict)]
        for row in sorted(days, key=lambda r: (str(r.get("day")), str(r.get("account")), str(r.get("kind")))):
            daily.add_row(
                escape(str(row.get("day"))),
                escape(printable(str(row.get("account", "")))),
                escape(str(row.get("kind"))),
                _hours(row.get("device_seconds")),
                f"{float(row.get('device_seconds') or 0):.0f}",
            )
        out.print(daily)
    return OK
