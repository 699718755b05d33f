# Placeholder for leases for the control plane's single actors (issue 43); filled in by that work.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0028_task_environments"),
    ]

    operations: list[migrations.operations.base.Operation] = []
