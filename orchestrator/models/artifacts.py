"""The files a job's tasks produce (the final model), uploaded by their agents to be downloaded from here."""

from __future__ import annotations

from django.db import models

from orchestrator.models.jobs import Job, Task


class JobArtifact(models.Model):
    """A file a task produced (the final model), uploaded by its agent so it can be downloaded from here."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="artifacts")
    task = models.ForeignKey(Task, on_delete=models.SET_NULL, null=True, related_name="artifacts")
    name = models.CharField(max_length=100)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    content = models.BinaryField(blank=True, default=b"")  # empty when it lies in the object store (`key`)
    key = models.CharField("object store key", max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The sealed time (its agent's clock) of the message it came with: an older one of the same name, late or
    # replayed, does not replace it.
    sent_at = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="artifact_name_unique_in_job")]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.name}"
