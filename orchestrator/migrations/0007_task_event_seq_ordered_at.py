from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("orchestrator", "0006_task_restarts")]

    operations = [
        migrations.AddField(model_name="task", name="event_seq", field=models.BigIntegerField(default=0)),
        migrations.AddField(model_name="task", name="ordered_at", field=models.DateTimeField(blank=True, null=True)),
    ]
