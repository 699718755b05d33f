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
# Per grouping: the account's id and its name, and the join that names it.
_ACCOUNT = {
    "user": ("u.user_id", f"a.{get_user_model().USERNAME_FIELD}",
             f"JOIN {get_user_model()._meta.db_table} a ON a.id = u.user_id"),
    "group": ("g.group_id", "a.name", f"JOIN {Group._meta.db_table} a ON a.id = g.group_id"),
    "cluster": ("u.cluster_id", "c.name", ""),
}  # fmt: skip


@dataclass(frozen=True)
class Filters:
    """Narrowing a reader asked for (ids already checked against their scope)."""

    user: int | None = None
    group: int | None = None
    cluster: int | None = None


# One day of one account's use of one device kind, as the database returns it: (day, account, kind, device-seconds of
# ended tasks (the rollup) and running ones so far, of which running tasks', cost: device-hours x the cluster's price,
# None when no cluster of it has a price). Plain tuples: a 90-day read for hundreds of users is tens of thousands of
# rows, and an object per row cost more than the query itself.
Row = tuple[date, str, str, float, float, float | None]


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
    rows: list[Row]  # in no order
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
    account, name, named = _ACCOUNT[query.by]
    # Rows in Row's shape (running seconds 0: added after), named in SQL: Python only passes them on. Unordered: at
    # 200 users x 90 days, sorting the 35,000 cells (here or there), or a second grouping set for the totals, cost
    # more than the aggregate itself (bench/usage_query.py); whoever lists the days sorts what it shows.
    sql = f"""
        SELECT u.day, {name}, u.kind, SUM(u.device_seconds), 0.0::float8,
               SUM(u.device_seconds * c.price_per_device_hour::float8) / 3600.0
        FROM {UsageDay._meta.db_table} u JOIN {Cluster._meta.db_table} c ON c.id = u.cluster_id {join} {named}
        WHERE {" AND ".join(where)}
        GROUP BY u.day, {account}, {name}, u.kind
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
        start = held_from(placed_at, started_at)
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


def _with_running(rows: list[Row], running: list[Row]) -> list[Row]:
    """The rollup's rows with running tasks' cells added to theirs (a row of their own where the rollup has none)."""
    if not running:
        return rows
    at = {row[:3]: n for n, row in enumerate(rows)}
    for cell in running:
        n = at.get(cell[:3])
        if n is None:
            at[cell[:3]] = len(rows)
            rows.append(cell)
        else:
            day, account, kind, seconds, ran, cost = rows[n]
            rows[n] = (day, account, kind, seconds + cell[3], ran + cell[4], _add_cost(cost, cell[5]))
    return rows


def _accounts(rows: list[Row]) -> list[Account]:
    """Each account's totals over the period, most used first."""
    totals: dict[str, Account] = {}
    for _day, account, kind, seconds, running, cost in rows:
        total = totals.get(account)
        if total is None:
            total = totals[account] = Account(account=account)
        total.device_seconds += seconds
        total.running_seconds += running
        total.by_kind[kind] = total.by_kind.get(kind, 0.0) + seconds
        if cost is not None:
            total.cost = (total.cost or 0.0) + cost
    return sorted(totals.values(), key=lambda a: (-a.device_seconds, a.account))


def read(query: Query, scope: Scope, filters: Filters, now: datetime) -> Report:
    """The usage of the period per day, account and kind, as `scope` may see it, ended and running tasks together."""
    sql, params = _rollup_sql(query, scope, filters)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows: list[Row] = cursor.fetchall()
    prices = {
        pk: None if p is None else float(p) for pk, p in Cluster.objects.values_list("pk", "price_per_device_hour")
    }
    held = _running(query, scope, filters, now, prices)
    names = _names(query.by, {account for _day, account, *_rest in held})
    running: list[Row] = [(day, names.get(a, f"#{a}"), kind, s, s, cost) for day, a, kind, s, cost in held]
    rows = _with_running(rows, running)
    return Report(query=query, rows=rows, accounts=_accounts(rows), generated_at=now)


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
