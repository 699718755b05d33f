# The job's own environment variables (issue 24): name -> value, checked by contracts/job_env.py.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0013_webhooks"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="env",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="the job's own environment variables, name -> value (contracts/job_env.py)",
            ),
        ),
    ]
