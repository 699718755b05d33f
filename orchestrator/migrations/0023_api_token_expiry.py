# Hand-written; its operations are filled in by the change it is named for.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0022_priority_class_rights"),
    ]

    operations: list[migrations.operations.base.Operation] = []
