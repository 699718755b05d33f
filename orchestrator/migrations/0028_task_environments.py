# Placeholder for task environments per cluster (issue 43); filled in by that work.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0027_agent_protocol"),
    ]

    operations: list[migrations.operations.base.Operation] = []
