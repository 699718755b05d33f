"""Model reads compiled once and run again with other values.

Django compiles a queryset into SQL every time it runs it. For a read asked for every task event (a task with its job
and host, locked) the compiling was about a third of the orchestrator's CPU per event (bench/event_cost.py: an exit's
read brings 100-odd columns, each compiled again). A `CompiledRead` makes the queryset for the first values of a
given count, keeps its SQL and the compiler's plan for turning rows into instances (select_related's included), and
for later values of that count only runs the SQL and builds the instances, as Django's own iterator does.

Per thread: a compiler belongs to its thread's database connection.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators

M = TypeVar("M", bound=Model)


class _Compiled:
    """One queryset's SQL and how its rows become instances (django.db.models.query.ModelIterable's steps)."""

    def __init__(self, queryset: QuerySet[Any], values: Sequence[Any]) -> None:
        self.db = queryset.db
        self.compiler = queryset.query.get_compiler(using=self.db)
        self.sql, params = self.compiler.as_sql()
        # The values must be the query's parameters in one run, in order, found once, for other values to take their
        # places; any other parameter is a constant (e.g. the states of a `state__in`), kept as it is.
        params, n = list(params), len(values)
        at = [i for i in range(len(params) - n + 1) if params[i : i + n] == list(values)]
        if len(at) != 1:
            raise ValueError(f"not a read of its values in one run: {params!r} for {list(values)!r}")
        self.before, self.after = params[: at[0]], params[at[0] + n :]
        compiler = self.compiler
        if compiler.annotation_col_map or compiler.has_extra_select or queryset._known_related_objects:
            raise ValueError("a read of model rows only: no annotations, extra columns or known related objects")
        fields = [column[0] for column in compiler.select[: compiler.col_count]]
        if compiler.has_composite_fields(fields):
            raise ValueError("a read of model rows only: no composite fields")
        # What turns each column's value into the field's (compiler.results_iter makes them again for every run).
        self.converters = compiler.get_converters(fields)
        klass_info, select = compiler.klass_info, compiler.select
        self.start, self.end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
        self.model = klass_info["model"]
        self.init_list = [column[0].target.attname for column in select[self.start : self.end]]
        self.populators = get_related_populators(klass_info, select, self.db)

    def run(self, values: Sequence[Any]) -> list[Any]:
        with connections[self.db].cursor() as cursor:
            cursor.execute(self.sql, [*self.before, *values, *self.after])
            rows = cursor.fetchall()
        found = []
        if self.converters:
            rows = self.compiler.apply_converters(rows, self.converters)
        for row in rows:
            obj = self.model.from_db(self.db, self.init_list, row[self.start : self.end])
            for populator in self.populators:
                populator.populate(row, obj)
            found.append(obj)
        return found


class CompiledRead(Generic[M]):
    """`make(values)`: the queryset for these values (its parameters must be these values in one run, in order, e.g.
    a `pk__in` of sorted distinct ids, and constants: the same in every call). Calling the read returns the instances
    that queryset would, compiled once per count of values in each thread."""

    def __init__(self, make: Callable[[Sequence[Any]], QuerySet[M]]) -> None:
        self._make = make
        self._local = threading.local()

    def __call__(self, values: Sequence[Any]) -> list[M]:
        if not values:
            return list(self._make(values))  # (an empty IN matches nothing: Django answers without a query)
        by_count: dict[int, _Compiled] = self._local.__dict__.setdefault("by_count", {})
        compiled = by_count.get(len(values))
        if compiled is None:
            compiled = by_count[len(values)] = _Compiled(self._make(values), values)
        return compiled.run(values)
