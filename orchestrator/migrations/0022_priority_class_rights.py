# Hand-written; its operations are filled in by the change it is named for.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0021_cluster_packing"),
    ]

    operations: list[migrations.operations.base.Operation] = []
