# Hand-written: a delivery's claim (orchestrator/webhooks/outbox.py writes a try's outcome only under its own claim).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0024_cluster_task_uids"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookdelivery",
            name="claim",
            field=models.UUIDField(blank=True, editable=False, null=True),
        ),
    ]
