"""Ports an agent found taken by something else on a host: placement avoids them for a while."""

from __future__ import annotations

from django.db import models

from orchestrator.models.clusters import Host


class HostPortBlock(models.Model):
    """A port an agent found taken by something else; placement avoids it until `until`."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="port_blocks")
    port = models.PositiveIntegerField()
    until = models.DateTimeField()
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host", "port"], name="port_block_unique")]

    def __str__(self) -> str:
        return f"{self.host_id}:{self.port}"
