"""Task environments: the Python installations with TensorFlow on a cluster's hosts that staff register under a
name (contracts/environments.py says what one is). A job names one; each host's agent reports how its probe of each
went (Host.environments), and placement uses only the hosts where it is ok (orchestrator/scheduler/fleet_state.py).

A cluster with none registered runs every job in the agents' own interpreter, as before environments existed; once
it has some, exactly one is its default, which a job that names none gets.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from contracts import environments as rules
from orchestrator.models.clusters import Cluster


def validate_name(value: str) -> None:
    problem = rules.name_problem(value)
    if problem:
        raise ValidationError(problem[0].upper() + problem[1:] + ".", code="environment_name")


def validate_interpreter(value: str) -> None:
    problem = rules.interpreter_problem(value)
    if problem:
        raise ValidationError(problem[0].upper() + problem[1:] + ".", code="interpreter")


class TaskEnvironment(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="environments")
    name = models.CharField(max_length=63, validators=[validate_name], help_text=rules.NAME_RULE)
    interpreter = models.CharField(
        max_length=rules.MAX_INTERPRETER_CHARS,
        validators=[validate_interpreter],
        help_text="The Python of the environment on every host of the cluster, an absolute path, e.g. "
        "/opt/envs/tf-2.17/bin/python. Tasks run as their own users: they must be able to run it.",
    )
    labels = models.CharField(
        max_length=rules.MAX_LABELS_CHARS,
        blank=True,
        help_text="What it holds, for people, e.g. tf-2.17-cuda12 (what TensorFlow it really has is probed on each "
        "host and shown on the host's page).",
    )
    is_default = models.BooleanField(
        "default", default=False, help_text="the environment a job of this cluster runs in when it names none"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="environment_name_unique_in_cluster"),
            models.UniqueConstraint(
                fields=["cluster"], condition=models.Q(is_default=True), name="one_default_environment_per_cluster"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}" if self.cluster_id else self.name

    def clean(self) -> None:
        super().clean()
        if not self.cluster_id:
            return
        others = TaskEnvironment.objects.filter(cluster_id=self.cluster_id).exclude(pk=self.pk)
        if len(others) >= rules.MAX_ENVIRONMENTS:
            raise ValidationError(f"A cluster has at most {rules.MAX_ENVIRONMENTS} environments.")
        if self.is_default and others.filter(is_default=True).exists():
            # Said plainly instead of the constraint's IntegrityError: staff unset the other one first.
            current = others.get(is_default=True)
            raise ValidationError(
                {"is_default": f"{current.name} is this cluster's default: untick it there first (one per cluster)."}
            )
        if not self.is_default and not others.filter(is_default=True).exists():
            raise ValidationError({"is_default": "A cluster's first environment is its default: tick it."})


def cluster_environments(cluster_id: int) -> list[rules.Environment]:
    """What the cluster's agents are told (contracts/environments.py AGENT_ENVIRONMENTS)."""
    rows = TaskEnvironment.objects.filter(cluster_id=cluster_id).order_by("name").values_list("name", "interpreter")
    return [rules.Environment(name, interpreter) for name, interpreter in rows]


def default_environment(cluster_id: int) -> str:
    """The name a job of the cluster runs in when it names none: its default, "" (the agents' own interpreter) when
    it has no environment registered."""
    found = TaskEnvironment.objects.filter(cluster_id=cluster_id, is_default=True).values_list("name", flat=True)
    return found.first() or ""
