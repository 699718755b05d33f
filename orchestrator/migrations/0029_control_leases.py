# Leases for the control plane's single actors (issue 43): exactly one beat and one scheduler act at a time, whatever
# number of control planes run (orchestrator/leases/). One row per lease name; written only by raw statements that
# use the database's clock.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0028_task_environments"),
    ]

    operations: list[migrations.operations.base.Operation] = [
        migrations.CreateModel(
            name="ControlLease",
            fields=[
                ("name", models.CharField(max_length=64, primary_key=True, serialize=False)),
                (
                    "holder",
                    models.CharField(help_text="host:pid:nonce of the process that holds it", max_length=200),
                ),
                ("acquired_at", models.DateTimeField(help_text="when this holder took it (the database's clock)")),
                ("renewed_at", models.DateTimeField(help_text="when this holder last renewed it")),
                ("expires_at", models.DateTimeField(help_text="free for another holder from this time on")),
                (
                    "transitions",
                    models.PositiveIntegerField(default=0, help_text="how many times it changed hands"),
                ),
            ],
            options={"verbose_name": "control-plane lease"},
        ),
    ]
