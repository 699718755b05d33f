# Hand-written; its operations are filled in by the change it is named for.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0023_api_token_expiry"),
    ]

    operations: list[migrations.operations.base.Operation] = []
