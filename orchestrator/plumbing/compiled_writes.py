"""Saves of a few fields of a row, compiled once and run again with other values.

`instance.save(update_fields=...)` builds and compiles an UPDATE every time it runs (a filter by pk, a query, the
compiler). Every task event saves its task (and often its job) so: at fleet size that building was a fifth of an
exit's CPU (bench/event_cost.py). `save_fields(instance, fields)` does what that save does — the fields' `pre_save`,
the `pre_save` and `post_save` signals (the pages are told by a receiver, orchestrator/apps.py), an error when no row
was updated — with the UPDATE compiled once per model, fields and NULLs, per thread (a compiler belongs to its
thread's database connection). A value that is an expression (an `F()`) goes through `save` as before.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, connections, router, transaction
from django.db.models import Field, Model
from django.db.models.signals import post_save, pre_save
from django.db.models.sql import UpdateQuery


class _CompiledSave:
    """One model's UPDATE of these fields by primary key, as Django compiles it for values that are NULL where these
    are (Django writes `= NULL` into the statement, not a parameter)."""

    def __init__(self, model: type[Model], fields: list[Field[Any, Any]], db: str, values: list[Any], pk: Any) -> None:
        if any(field.primary_key or not field.concrete or hasattr(field, "get_placeholder") for field in fields):
            # (A field with its own placeholder may write a value its own way: compiled per value, not once.)
            raise ValueError(f"not a plain update of {model.__name__} fields {[f.name for f in fields]}")
        # As QuerySet._update builds it (Model.save's path with update_fields).
        query = model._base_manager.using(db).filter(pk=pk).query.chain(UpdateQuery)
        query.add_update_fields([(field, None, value) for field, value in zip(fields, values, strict=True)])
        self.sql, params = query.get_compiler(db).as_sql()
        expected = [*_prepared(fields, values, db), _key(model, pk, db)]
        if [_plain(value) for value in params] != [_plain(value) for value in expected if value is not None]:
            # The fields' values and the key must be the statement's only parameters, in order.
            raise ValueError(f"not an update of its values alone: {params!r}")


def _prepared(fields: list[Field[Any, Any]], values: Sequence[Any], db: str) -> list[Any]:
    connection = connections[db]
    return [field.get_db_prep_save(value, connection) for field, value in zip(fields, values, strict=True)]


def _key(model: type[Model], pk: Any, db: str) -> Any:
    return model._meta.pk.get_db_prep_value(pk, connections[db])  # type: ignore[union-attr]


def _plain(value: Any) -> Any:
    """A parameter as compared: a JSON value's adapter (psycopg's Jsonb) compares by identity, its `obj` by value."""
    return getattr(value, "obj", value)


_local = threading.local()


def save_fields(instance: Model, names: Sequence[str]) -> None:
    """`instance.save(update_fields=names)`, its UPDATE compiled once per model, fields and NULLs in each thread."""
    if not names:
        return  # (as save does: nothing to write, no signals)
    model, meta = type(instance), instance._meta
    db = instance._state.db or router.db_for_write(model, instance=instance)
    fields: list[Field[Any, Any]] = [meta.get_field(name) for name in names]  # type: ignore[misc]
    if meta.proxy or meta.parents or any(hasattr(getattr(instance, f.attname), "resolve_expression") for f in fields):
        instance.save(update_fields=names)
        return
    # Model.save's steps, in its order.
    instance._prepare_related_fields_for_save(operation_name="save", fields=fields)
    update_fields = frozenset(names)
    pre_save.send(sender=model, instance=instance, raw=False, using=db, update_fields=update_fields)
    values = [field.pre_save(instance, False) for field in fields]  # type: ignore[attr-defined]
    prepared = _prepared(fields, values, db)
    key = (model, tuple(names), db, tuple(value is None for value in prepared))
    compiled: dict[Any, _CompiledSave] = _local.__dict__.setdefault("compiled", {})
    if key not in compiled:
        compiled[key] = _CompiledSave(model, fields, db, values, instance.pk)
    params = [value for value in prepared if value is not None] + [_key(model, instance.pk, db)]
    with transaction.mark_for_rollback_on_error(using=db), connections[db].cursor() as cursor:
        cursor.execute(compiled[key].sql, params)
        updated = cursor.rowcount
    if not updated:
        raise DatabaseError("Save with update_fields did not affect any rows.")
    instance._state.db, instance._state.adding = db, False
    post_save.send(sender=model, instance=instance, created=False, update_fields=update_fields, raw=False, using=db)
