# Hand-written: what a task's agent dropped of its output for the per-task bounds (contracts/publish_limits.py).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0025_webhook_delivery_deadline"),
    ]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddField(
            model_name="task", name="artifacts_dropped", field=models.PositiveBigIntegerField(default=0)
        ),
        migrations.AddField(
            model_name="task", name="artifact_bytes_dropped", field=models.PositiveBigIntegerField(default=0)
        ),
        migrations.AddField(
            model_name="task", name="log_lines_dropped", field=models.PositiveBigIntegerField(default=0)
        ),
        migrations.AddField(
            model_name="task", name="metric_lines_dropped", field=models.PositiveBigIntegerField(default=0)
        ),
    ]
