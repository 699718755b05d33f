"""Usage read for a period, per day and account (a user, a group or a cluster) and device kind (`read`): the rollup's
rows summed in one grouped query over a range of days (never a scan of tasks), plus what tasks still running have
held so far, computed live from them (few: at most the devices of the fleet). The API, the page and the CLI (through
the API) show this; Prometheus counts `totals`, the rollup alone (ended tasks: a counter never goes down).

A group's usage is its members' at read time: the rollup keeps users, so a change of membership moves a user's past
usage with them, and a user in two groups counts in both."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.db.models import Sum

from orchestrator.models import ACTIVE_TASK_STATES, Cluster, Task, UsageDay, device_kind
from orchestrator.usage.days import day_start, split_by_day
from orchestrator.usage.periods import Query
from orchestrator.usage.recording import held_from
from orchestrator.usage.scopes import Scope

_GROUPS_OF_USERS = get_user_model().groups.through._meta.db_table
_ACCOUNT = {"user": "u.user_id", "group": "g.group_id", "cluster": "u.cluster_id"}


@dataclass(frozen=True)
class Filters:
    """Narrowing a reader asked for (ids already checked against their scope)."""

    user: int | None = None
    group: int | None = None
    cluster: int | None = None


@dataclass
class Row:
    day: date
    account: str
    kind: str
    device_seconds: float  # ended tasks' (the rollup) and running tasks' so far
    running_seconds: float  # of which running tasks'
    cost: float | None  # device-hours x the cluster's price; None when no cluster of it has a price


@dataclass
class Account:
    account: str
    device_seconds: float = 0.0
    running_seconds: float = 0.0
    by_kind: dict[str, float] = field(default_factory=dict)
    cost: float | None = None

    @property
    def device_hours(self) -> float:
        return self.device_seconds / 3600.0


@dataclass
class Report:
    query: Query
    rows: list[Row]  # by day, then account, then kind
    accounts: list[Account]  # the period's totals, most used first
    generated_at: datetime

    @property
    def device_seconds(self) -> float:
        return sum(a.device_seconds for a in self.accounts)

    @property
    def priced(self) -> bool:
        return any(a.cost is not None for a in self.accounts)


def _add_cost(total: float | None, cost: float | None) -> float | None:
    return total if cost is None else (total or 0.0) + cost


def _rollup_sql(query: Query, scope: Scope, filters: Filters) -> tuple[str, list[Any]]:
    where = ["u.day BETWEEN %s AND %s"]
    params: list[Any] = [query.start, query.end]
    join = f"JOIN {_GROUPS_OF_USERS} g ON g.user_id = u.user_id" if query.by == "group" else ""
    if query.by == "group" and scope.groups is not None:
        where.append("g.group_id = ANY(%s)")  # a group's usage is all its members': the reader's groups bound it
        params.append(sorted(scope.groups))
    elif scope.users is not None:
        where.append("u.user_id = ANY(%s)")
        params.append(sorted(scope.users))
    if filters.user is not None:
        where.append("u.user_id = %s")
        params.append(filters.user)
    if filters.group is not None:
        where.append(f"u.user_id IN (SELECT user_id FROM {_GROUPS_OF_USERS} WHERE group_id = %s)")  # noqa: S608
        params.append(filters.group)
        if query.by == "group":
            where.append("g.group_id = %s")  # not the members' other groups
            params.append(filters.group)
    if filters.cluster is not None:
        where.append("u.cluster_id = %s")
        params.append(filters.cluster)
    sql = f"""
        SELECT u.day, {_ACCOUNT[query.by]}, u.kind, SUM(u.device_seconds),
               SUM(u.device_seconds * c.price_per_device_hour::float8) / 3600.0
        FROM {UsageDay._meta.db_table} u JOIN {Cluster._meta.db_table} c ON c.id = u.cluster_id {join}
        WHERE {" AND ".join(where)}
        GROUP BY 1, 2, 3
    """  # noqa: S608 - table names from the models, values parameters
    return sql, params


def _running(
    query: Query, scope: Scope, filters: Filters, now: datetime, prices: dict[int, float | None]
) -> list[tuple[date, int, str, float, float | None]]:
    """(day, account id, kind, device-seconds so far, cost) of the tasks holding devices now, within the period."""
    tasks = Task.objects.filter(state__in=ACTIVE_TASK_STATES, usage_recorded=False)
    if scope.users is not None and not (query.by == "group" and scope.groups is not None):
        tasks = tasks.filter(job__owner_id__in=scope.users)
    if filters.user is not None:
        tasks = tasks.filter(job__owner_id=filters.user)
    if filters.group is not None:
        tasks = tasks.filter(job__owner__groups=filters.group)
    if filters.cluster is not None:
        tasks = tasks.filter(job__cluster_id=filters.cluster)
    rows = list(
        tasks.order_by().values_list("placed_at", "started_at", "devices", "job__owner_id", "job__cluster_id",
                                     "host__gpus")
    )  # fmt: skip
    groups_of: dict[int, list[int]] = defaultdict(list)
    if query.by == "group" and rows:
        through = get_user_model().groups.through.objects.filter(user_id__in={r[3] for r in rows})
        for user_id, group_id in through.values_list("user_id", "group_id"):
            if (scope.groups is None or group_id in scope.groups) and filters.group in (None, group_id):
                groups_of[user_id].append(group_id)
    since, until = day_start(query.start), min(now, day_start(query.end + timedelta(days=1)))
    held = []
    for placed_at, started_at, devices, owner_id, cluster_id, gpus in rows:
        start = held_from(Task(placed_at=placed_at, started_at=started_at))
        if start is None or not devices:
            continue
        kind = device_kind(gpus)
        accounts = {"user": [owner_id], "cluster": [cluster_id], "group": groups_of.get(owner_id, [])}[query.by]
        price = prices.get(cluster_id)
        for day, seconds in split_by_day(max(start, since), until):
            used = len(devices) * seconds
            cost = None if price is None else used * price / 3600.0
            held += [(day, account, kind, used, cost) for account in accounts]
    return held


def _names(by: str, ids: set[int]) -> dict[int, str]:
    if by == "user":
        model = get_user_model()
        return dict(model.objects.filter(pk__in=ids).values_list("pk", model.USERNAME_FIELD))
    if by == "group":
        return dict(Group.objects.filter(pk__in=ids).values_list("pk", "name"))
    return dict(Cluster.objects.filter(pk__in=ids).values_list("pk", "name"))


def read(query: Query, scope: Scope, filters: Filters, now: datetime) -> Report:
    """The usage of the period per day, account and kind, as `scope` may see it, ended and running tasks together."""
    sql, params = _rollup_sql(query, scope, filters)
    cells: dict[tuple[date, int, str], list[Any]] = {}  # -> [device-seconds, running seconds, cost]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for day, account, kind, seconds, cost in cursor.fetchall():
            cells[(day, account, kind)] = [seconds, 0.0, cost]
    prices = {
        pk: None if p is None else float(p) for pk, p in Cluster.objects.values_list("pk", "price_per_device_hour")
    }
    for day, account, kind, seconds, cost in _running(query, scope, filters, now, prices):
        cell = cells.setdefault((day, account, kind), [0.0, 0.0, None])
        cell[0] += seconds
        cell[1] += seconds
        cell[2] = _add_cost(cell[2], cost)
    names = _names(query.by, {account for _day, account, _kind in cells})
    rows: list[Row] = []
    totals: dict[str, Account] = {}
    for (day, account, kind), (seconds, running, cost) in sorted(
        cells.items(), key=lambda item: (item[0][0], names.get(item[0][1], ""), item[0][2])
    ):
        name = names.get(account, f"#{account}")
        rows.append(Row(day=day, account=name, kind=kind, device_seconds=seconds, running_seconds=running, cost=cost))
        total = totals.setdefault(name, Account(account=name))
        total.device_seconds += seconds
        total.running_seconds += running
        total.by_kind[kind] = total.by_kind.get(kind, 0.0) + seconds
        total.cost = _add_cost(total.cost, cost)
    accounts = sorted(totals.values(), key=lambda a: (-a.device_seconds, a.account))
    return Report(query=query, rows=rows, accounts=accounts, generated_at=now)


def totals() -> list[tuple[str, str, str, float]]:
    """(user, cluster, kind, device-seconds) of every ended task ever recorded: Prometheus's counters."""
    user_field = f"user__{get_user_model().USERNAME_FIELD}"
    summed = (
        UsageDay.objects.order_by()
        .values_list(user_field, "cluster__name", "kind")
        .annotate(seconds=Sum("device_seconds"))
        .order_by(user_field, "cluster__name", "kind")
    )
    return [(user, cluster, kind, float(seconds)) for user, cluster, kind, seconds in summed]
