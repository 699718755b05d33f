"""Writing a scheduler pass's new task rows: by COPY, then their ids in one query.

A pass over a full queue writes thousands of rows, each with its TF_CONFIG (the whole cluster of its job): Django's
INSERT compiled and quoted every value, a third of such a pass (bench/pass_cost.py: 271 ms of 788 ms for 2,770
rows). COPY sends them as rows of text; the values are the ones the model's fields prepare for the database, so the
rows are what `bulk_create` would have written, defaults included.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from orchestrator.models import Job, Task

# Every column but the id (the table's sequence numbers the rows), as the model declares them.
_FIELDS = [field for field in Task._meta.concrete_fields if not field.primary_key]
_BY_ATTNAME = {field.attname: (position, field) for position, field in enumerate(_FIELDS)}
_COPY_SQL = f"COPY {Task._meta.db_table} ({', '.join(f.column for f in _FIELDS)}) FROM STDIN"
_IDS_SQL = f"""
    SELECT t.id FROM {Task._meta.db_table} t JOIN {Job._meta.db_table} j ON j.id = t.job_id AND t.attempt = j.attempt
    WHERE t.job_id = ANY(%s)
"""  # noqa: S608 - table names from the models, the value a parameter


class JsonText(str):
    """A JSON column's value already serialized (tf_config.tf_config_texts): written as it is, where any other value
    is prepared by its field (which would encode a str as a JSON string)."""

    __slots__ = ()


def insert_current(rows: list[dict[str, Any]]) -> list[int]:
    """Write these task rows, each given as the values the pass sets (by field attname: `job_id`, `host_id`, `type`
    ...), every other column the model's default; each of its job's current attempt (the pass moved the jobs'
    `attempt` on first, in the same transaction). Returns the ids of every task of those jobs' current attempts, which
    are these. (Plain values, not Task instances: building a model instance per row was a tenth of a busy pass.)"""
    if not rows:
        return []
    db = connections[DEFAULT_DB_ALIAS]  # the wrapper itself: each use of the `connection` proxy is a local lookup
    # Most columns keep the model's defaults (state, pid, facts ...): those are prepared once, not once a row.
    blank = Task()
    template = [f.get_db_prep_save(f.pre_save(blank, add=True), db) for f in _FIELDS]
    with db.cursor() as cursor:
        raw = cursor.cursor  # psycopg's own cursor: Django's wrapper has no copy()
        with raw.copy(_COPY_SQL) as copy:
            for row in rows:
                values = template.copy()
                for name, value in row.items():
                    position, field = _BY_ATTNAME[name]
                    values[position] = value if type(value) is JsonText else field.get_db_prep_save(value, db)
                copy.write_row(values)
        cursor.execute(_IDS_SQL, [sorted({row["job_id"] for row in rows})])
        return [task_id for (task_id,) in cursor.fetchall()]
