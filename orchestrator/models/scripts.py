"""Uploaded training scripts, stored once per content (SHA-256); a job names the one it runs."""

from __future__ import annotations

from django.db import models


class Script(models.Model):
    """An uploaded training script, stored once per content (SHA-256); it travels to agents inside launch orders."""

    sha256 = models.CharField(max_length=64, primary_key=True)
    content = models.BinaryField()
    size = models.PositiveIntegerField()
    filename = models.CharField(max_length=255, help_text="the name it was first uploaded under (display only)")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.filename} ({self.sha256[:12]})"
