"""The usage page: device-hours per account per day as a stacked chart (usage.js, from the page's json_script data)
and each account's totals in a table, with the showback cost where staff priced a cluster. The question and its
answer are orchestrator/usage/asking.py's, as for GET /api/usage/: the page and the API cannot disagree."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from orchestrator.models import DeviceKind
from orchestrator.usage import asking, periods, reads, scopes
from orchestrator.usage.days import day_start

# The chart stacks this many accounts, the most used; the rest are one band, "others" (the table lists them all).
CHART_ACCOUNTS = 10
OTHERS = "others"


def chart_data(report: reads.Report) -> dict[str, Any]:
    """Device-hours per account per day for usage.js: `days` (UTC midnights, epoch seconds) and one list per account,
    most used first, every day present (0 where none)."""
    days = report.query.days
    shown = [a.account for a in report.accounts[:CHART_ACCOUNTS]]
    series = {name: [0.0] * len(days) for name in shown}
    at = {day: n for n, day in enumerate(days)}
    for day, account, _kind, seconds, _running, _cost in report.rows:
        name = account if account in series else OTHERS
        values = series.setdefault(name, [0.0] * len(days))
        values[at[day]] += seconds / 3600.0
    return {
        "days": [int(day_start(day).timestamp()) for day in days],
        "accounts": [{"name": name, "hours": [round(v, 4) for v in values]} for name, values in series.items()],
    }


@require_GET
def usage(request: HttpRequest) -> HttpResponse:
    params = {key: request.GET.get(key, "") for key in ("from", "to", "by", "user", "group", "cluster")}
    context: dict[str, Any] = {"params": params, "by_choices": periods.BY, "kinds": DeviceKind.values,
                               "max_days": periods.MAX_DAYS}  # fmt: skip
    status = 200
    try:
        report = asking.ask(request.user, params, timezone.now())
    except periods.BadQuery as exc:
        context["problem"], status = exc.message, 400
    except scopes.NotYours as exc:
        context["problem"], status = str(exc), 403
    else:
        accounts = [
            {
                "account": a.account,
                "kind_hours": [a.by_kind.get(kind, 0.0) / 3600.0 for kind in DeviceKind.values],
                "device_hours": a.device_hours,
                "device_seconds": a.device_seconds,
                "running_seconds": a.running_seconds,
                "cost": a.cost,
            }
            for a in report.accounts
        ]
        context.update(report=report, accounts=accounts, chart=chart_data(report), start=report.query.start,
                       end=report.query.end, device_hours=report.device_seconds / 3600.0)  # fmt: skip
    return render(request, "dashboard/usage.html", context, status=status)
