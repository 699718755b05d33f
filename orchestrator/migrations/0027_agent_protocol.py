# Placeholder for the agent distribution (issue 43): protocol and version an agent speaks; filled in by that work.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0026_task_output_drops"),
    ]

    operations: list[migrations.operations.base.Operation] = []
