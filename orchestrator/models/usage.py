"""Device usage per UTC day: the rollup every usage read sums (orchestrator/usage/), one row per (day, cluster, user,
device kind), never a scan of tasks. A task's device-seconds are added at its end, split at UTC midnights."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from orchestrator.models.clusters import Cluster


class DeviceKind(models.TextChoices):
    # What a task's devices were: its host's GPUs, else logical CPU devices (Host.device_slots).
    GPU = "gpu", "GPU"
    CPU = "cpu", "CPU"


class UsageDay(models.Model):
    id = models.BigAutoField(primary_key=True)
    day = models.DateField()  # UTC
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=8, choices=DeviceKind.choices)
    device_seconds = models.FloatField(default=0.0)
    # Task ends that added to it (a task spanning midnight adds to each of its days).
    tasks = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            # The key the end of a task adds to (INSERT ... ON CONFLICT); day first: every read is a range of days.
            models.UniqueConstraint(fields=["day", "cluster", "user", "kind"], name="usage_day_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.cluster_id}/{self.user_id} {self.kind}: {self.device_seconds:.0f} s"


def device_kind(gpus: list[object] | None) -> str:
    """The kind of the devices a task on a host with these GPUs held: the one rule, for the rollup and running tasks."""
    return DeviceKind.GPU if gpus else DeviceKind.CPU
