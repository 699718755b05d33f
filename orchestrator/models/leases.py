"""Leases of the control plane's single actors (orchestrator/leases/): one row per lease name, who holds it and
until when, by the database's clock."""

from __future__ import annotations

from django.db import models


class ControlLease(models.Model):
    """Like a Kubernetes `coordination.k8s.io/Lease`: `holder` acts while `expires_at` (the database's clock) is
    ahead; anyone may take the row once it is behind. Written only by orchestrator/leases/store.py's statements."""

    name = models.CharField(max_length=64, primary_key=True)
    holder = models.CharField(max_length=200, help_text="host:pid:nonce of the process that holds it")
    acquired_at = models.DateTimeField(help_text="when this holder took it (the database's clock)")
    renewed_at = models.DateTimeField(help_text="when this holder last renewed it")
    expires_at = models.DateTimeField(help_text="free for another holder from this time on")
    transitions = models.PositiveIntegerField(default=0, help_text="how many times it changed hands")

    class Meta:
        verbose_name = "control-plane lease"

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder}"
