"""A host's samples deleted by PostgreSQL with the host (ON DELETE CASCADE), not only by Django's collector.

Django deletes a host's samples with one statement and the host with the next: a sample the ingest stored between
the two (an agent still reporting while an admin deletes its host) made the host's DELETE fail on the foreign key
(a CI run: ForeignKeyViolation on orchestrator_hostsample). With the cascade in the database, the host's DELETE takes
such a sample with it, and a sample stored after it fails alone (the ingest drops a vanished host's reports).
Django 5.2 cannot declare this on the field (its db_on_delete is 6.0's): the constraint is rewritten here, under the
name Django gave it, and HostSample.host's comment says so.
"""

from django.db import migrations

TABLE = "orchestrator_hostsample"


def _constraint(cursor) -> str:
    cursor.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'f' "
        "AND confrelid = 'orchestrator_host'::regclass",
        [TABLE],
    )
    (name,) = cursor.fetchone()
    return name


def _rewrite(on_delete: str):
    def rewrite(apps, schema_editor) -> None:
        quote = schema_editor.quote_name
        with schema_editor.connection.cursor() as cursor:
            name = quote(_constraint(cursor))
            cursor.execute(
                f"ALTER TABLE {quote(TABLE)} DROP CONSTRAINT {name}, ADD CONSTRAINT {name} FOREIGN KEY (host_id) "
                f"REFERENCES orchestrator_host (id) {on_delete} DEFERRABLE INITIALLY DEFERRED"
            )

    return rewrite


class Migration(migrations.Migration):
    dependencies = [("orchestrator", "0033_usage")]

    operations = [migrations.RunPython(_rewrite("ON DELETE CASCADE"), _rewrite(""))]
