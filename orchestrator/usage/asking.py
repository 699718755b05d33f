"""A reader's request for usage, from its parameters to the report (`ask`): the period and grouping (periods.py),
the narrowing by `user`, `group` or `cluster` (names), checked against what the reader may see (scopes.py). The API and
the page both call it, so they answer the same question the same way."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from orchestrator.models import Cluster
from orchestrator.usage import periods, reads, scopes
from orchestrator.usage.periods import BadQuery

NAME_MAX = 150


def _name(params: Mapping[str, str], field: str) -> str | None:
    value = params.get(field)
    if not value:
        return None
    if len(value) > NAME_MAX:
        raise BadQuery(field, f"`{field}` is a name of at most {NAME_MAX} characters.")
    return value


def ask(reader: Any, params: Mapping[str, str], now: datetime) -> reads.Report:
    """The usage `params` ask for, as `reader` may see it. Raises BadQuery (its field and message: a 400),
    scopes.NotYours (a 403)."""
    query = periods.parse(params, today=now.date())
    scope = scopes.scope_of(reader)
    user_name, group_name, cluster_name = (_name(params, f) for f in ("user", "group", "cluster"))
    try:
        user = scopes.user_named(scope, user_name) if user_name else None
    except LookupError as exc:
        raise BadQuery("user", str(exc)) from None
    try:
        group = scopes.group_named(scope, group_name) if group_name else None
    except LookupError as exc:
        raise BadQuery("group", str(exc)) from None
    cluster = None
    if cluster_name:
        cluster = Cluster.objects.filter(name=cluster_name).values_list("pk", flat=True).first()
        if cluster is None:
            raise BadQuery("cluster", f"No cluster named {cluster_name!r}.")
    return reads.read(query, scope, reads.Filters(user=user, group=group, cluster=cluster), now)
