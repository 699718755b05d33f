# Task environments per cluster (issue 43): the environments staff register, what each host's agent probed of them,
# and the environment (and requirements file) a job runs in. Existing jobs and clusters keep running in the agents'
# own interpreter: environment "" (no environment registered, no default).

import django.db.models.deletion
from django.db import migrations, models

import orchestrator.models.environments


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0027_agent_protocol"),
    ]

    operations = [
        migrations.CreateModel(
            name="TaskEnvironment",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "name",
                    models.CharField(
                        help_text="1-63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit "
                        "(e.g. tf-2.17-cuda12)",
                        max_length=63,
                        validators=[orchestrator.models.environments.validate_name],
                    ),
                ),
                (
                    "interpreter",
                    models.CharField(
                        help_text="The Python of the environment on every host of the cluster, an absolute path, "
                        "e.g. /opt/envs/tf-2.17/bin/python. Tasks run as their own users: they must be able to run "
                        "it.",
                        max_length=4096,
                        validators=[orchestrator.models.environments.validate_interpreter],
                    ),
                ),
                (
                    "labels",
                    models.CharField(
                        blank=True,
                        help_text="What it holds, for people, e.g. tf-2.17-cuda12 (what TensorFlow it really has is "
                        "probed on each host and shown on the host's page).",
                        max_length=200,
                    ),
                ),
                (
                    "is_default",
                    models.BooleanField(
                        default=False,
                        help_text="the environment a job of this cluster runs in when it names none",
                        verbose_name="default",
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "cluster",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="environments",
                        to="orchestrator.cluster",
                    ),
                ),
            ],
            options={
                "ordering": ["cluster__name", "name"],
                "constraints": [
                    models.UniqueConstraint(fields=("cluster", "name"), name="environment_name_unique_in_cluster"),
                    models.UniqueConstraint(
                        condition=models.Q(("is_default", True)),
                        fields=("cluster",),
                        name="one_default_environment_per_cluster",
                    ),
                ],
            },
        ),
        migrations.AddField(
            model_name="host",
            name="environments",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="job",
            name="environment",
            field=models.CharField(blank=True, max_length=63),
        ),
        migrations.AddField(
            model_name="job",
            name="requirements",
            field=models.TextField(blank=True),
        ),
    ]
