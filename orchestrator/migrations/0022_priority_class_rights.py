# Hand-written (issue 42, priority classes by right): who may submit at each priority class.

from django.conf import settings
from django.db import migrations, models


def open_what_gives_no_advantage(apps, schema_editor):
    """Existing classes: the default, and every class no higher than it, stay open to all; every class above the
    default becomes closed until staff grant it.

    Why: a class at or below the default gives its user nothing over anyone (it goes later, and may be preempted),
    so closing it would only break the scripts of people who submit at `low` to be kind to others. A class above the
    default is exactly what let anyone jump every queue and preempt others' `low` jobs: leaving it open would keep the
    hole this migration closes. Staff grant it per user or group in the admin (and staff themselves may use any
    class, as they may already move any waiting job to one)."""
    PriorityClass = apps.get_model("orchestrator", "PriorityClass")
    classes = PriorityClass.objects.using(schema_editor.connection.alias)  # the database being migrated
    default = classes.filter(is_default=True).first()
    # A job with no class counts as the default's value, or 0 where none is the default (control/queueing.py).
    bar = default.value if default is not None else 0
    classes.filter(models.Q(is_default=True) | models.Q(value__lte=bar)).update(open_to_all=True)


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("orchestrator", "0021_cluster_packing"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="priorityclass",
            name="groups",
            field=models.ManyToManyField(
                blank=True, help_text="whose members may submit at it", related_name="priority_classes", to="auth.group"
            ),
        ),
        migrations.AddField(
            model_name="priorityclass",
            name="open_to_all",
            field=models.BooleanField(
                default=False,
                help_text="every user may submit at this class; otherwise only the users and groups below, and staff",
            ),
        ),
        migrations.AddField(
            model_name="priorityclass",
            name="users",
            field=models.ManyToManyField(
                blank=True,
                help_text="who may submit at it",
                related_name="priority_classes",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.RunPython(open_what_gives_no_advantage, migrations.RunPython.noop),
    ]
