# Hand-written; its operations are filled in by the change it is named for.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0023_api_token_expiry"),
    ]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddField(
            model_name="job",
            name="task_uid_slot",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(("task_uid_slot__isnull", False)),
                fields=("cluster", "task_uid_slot"),
                name="one_job_per_task_uid_slot",
            ),
        ),
    ]
