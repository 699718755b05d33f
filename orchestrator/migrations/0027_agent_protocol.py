# The agent distribution (issue 43): which wire protocol a host's agent speaks, and why its messages are refused when
# it speaks one the control plane does not (orchestrator/models/clusters.py Host.agent_protocol, Host.agent_refusal).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0026_task_output_drops"),
    ]

    operations = [
        migrations.AddField(
            model_name="host",
            name="agent_protocol",
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="host",
            name="agent_refusal",
            field=models.CharField(blank=True, max_length=300),
        ),
    ]
