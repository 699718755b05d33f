"""Compare-strategies experiments: one program and hyperparameters run under two or more strategy/shape variants,
each run an ordinary Job (Job.experiment, Job.variant). The experiment's state derives from its jobs
(orchestrator/experiments/actions.py); only the choices the person made and a cancellation are stored here."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.urls import reverse

from orchestrator.models.clusters import Cluster


class ExperimentMode(models.TextChoices):
    SEQUENTIAL = "sequential", "one after another"
    PARALLEL = "parallel", "side by side"


class ExperimentQuerySet(models.QuerySet["Experiment"]):
    def visible_to(self, user: Any) -> ExperimentQuerySet:
        """The same rule as for jobs: the owner and staff; anyone else finds nothing (404)."""
        if user is None or not user.is_authenticated:
            return self.none()
        experiments = self.select_related("owner", "cluster")
        return experiments if user.is_staff else experiments.filter(owner=user)


class Experiment(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="experiments")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="experiments")
    name = models.CharField(max_length=200)
    mode = models.CharField(max_length=16, choices=ExperimentMode.choices, default=ExperimentMode.SEQUENTIAL)
    # Every variant's job is this job with the variant's strategy and shape: the JobField values (name left out),
    # program_kind/builtin/builtin_config/args and the script's hash (contracts: exactly what a Job takes).
    template = models.JSONField(default=dict)
    # [{"label", "strategy", "workers", "ps", "devices_per_worker"}, ...] in the order they run; a variant with
    # workers=1, ps=0, devices=1 under Mirrored is the 1-replica baseline.
    variants = models.JSONField(default=list)
    target_accuracy = models.FloatField(default=0.9)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    # Some variant has no job yet: what the control loop's level-triggered pass looks at (cleared once every variant
    # has its job, or on cancel), so finished experiments cost it nothing.
    pending = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ExperimentQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"experiment #{self.pk} {self.name}"

    def get_absolute_url(self) -> str:
        return reverse("dashboard:experiment", args=[self.pk])
