"""What a shared fleet's queue is made of besides jobs: priority classes, quotas, and each job's story.

Staff define priority classes and quotas in the admin; the scheduler (orchestrator/scheduler/scheduling.py) orders the
queue by class, then fair share, then submission, and may preempt lower preemptible classes or borrowers. Who may
submit at a class is the class's own (open to all, or its users and groups: Slurm's QOS per account); the rule that
reads it is orchestrator/scheduler/class_rights.py.
"""

from __future__ import annotations

from typing import TypeGuard

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.db.models import Q

from orchestrator.core.preemption import Protection
from orchestrator.models.clusters import Cluster
from orchestrator.models.jobs import Job

# What a team starts with (migration 0015 creates them, 0022 sets who may use them; staff change them in the admin):
# (name, value, preemptible, default, open to all, description). `high` is closed: it jumps every queue and preempts
# others' `low` jobs, so staff grant it to users or groups.
STANDARD_CLASSES = (
    ("low", 0, True, False, True, "may be preempted by normal and high jobs; resumes from its checkpoint"),
    ("normal", 100, False, True, True, "the default"),
    ("high", 200, False, False, False, "goes first; may preempt low jobs; only for the users and groups staff name"),
)


class PriorityClass(models.Model):
    name = models.SlugField(max_length=32, unique=True)
    value = models.IntegerField(help_text="higher goes first; a job may preempt jobs of lower preemptible classes")
    preemptible = models.BooleanField(default=False, help_text="its jobs may be stopped for a higher class's")
    is_default = models.BooleanField(default=False, help_text="the class of a job that names none")
    description = models.CharField(max_length=200, blank=True)
    # No thrash (orchestrator/core/preemption.py). The defaults: a restarted gang spends its first minute or so
    # starting TensorFlow, forming its cluster and warming its input pipeline, so five minutes keep most of a run
    # useful; three preemptions in a day is a job that has paid enough.
    min_run_s = models.PositiveIntegerField(
        default=300, help_text="seconds a job of this class runs (from each placement) before it may be preempted"
    )
    max_preemptions = models.PositiveIntegerField(
        default=3,
        null=True,
        blank=True,
        help_text="a job preempted this often within the window below is not preempted again until it ends; "
        "blank: no bound",
    )
    preemption_window_s = models.PositiveIntegerField(
        default=86_400, help_text="the window (seconds) of the bound above"
    )
    # Closed unless staff open it: a class staff add goes to nobody until they say who (the default class is open to
    # all whatever this says: a job naming no class must always be possible).
    open_to_all = models.BooleanField(
        default=False,
        help_text="every user may submit at this class; otherwise only the users and groups below, and staff",
    )
    users = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="priority_classes", help_text="who may submit at it"
    )
    groups = models.ManyToManyField(
        Group, blank=True, related_name="priority_classes", help_text="whose members may submit at it"
    )

    class Meta:
        ordering = ["-value", "name"]
        verbose_name_plural = "priority classes"
        constraints = [models.UniqueConstraint(fields=["is_default"], condition=Q(is_default=True), name="one_default")]

    def __str__(self) -> str:
        return self.name

    @property
    def protection(self) -> Protection:
        return Protection(self.min_run_s, self.max_preemptions, self.preemption_window_s)


class Quota(models.Model):
    """Devices a user (or a Django group, shared by its members) is entitled to on a cluster at once. Beyond it a job
    may still start on idle devices, borrowing them; a user under quota reclaims them by preemption (Kueue's model)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="quotas")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True)
    group = models.ForeignKey(Group, on_delete=models.CASCADE, null=True, blank=True)
    devices = models.PositiveIntegerField(help_text="devices (GPUs, or CPU slots) in use at once")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=False, group__isnull=True) | Q(user__isnull=True, group__isnull=False),
                name="quota_for_user_or_group",
            ),
            models.UniqueConstraint(fields=["cluster", "user"], condition=Q(user__isnull=False), name="quota_user"),
            models.UniqueConstraint(fields=["cluster", "group"], condition=Q(group__isnull=False), name="quota_group"),
        ]

    def __str__(self) -> str:
        return f"{self.user or self.group} on {self.cluster}: {self.devices} devices"


class JobEvent(models.Model):
    """One line of a job's story that its state alone does not tell: preempted, resumed, timed out, held, released,
    priority changed. Shown on the job page and in the API."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=16)
    text = models.CharField(max_length=500)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind}: {self.text}"

    # A preempted job placed again says where; the epoch it went on from is written when its process says which
    # checkpoint it restored (its facts' resumed_from_epoch), not guessed at placement: a peer may have reported an
    # epoch end whose checkpoint the chief never finished writing before the stop's SIGKILL.
    _RESUMING, _FROM = "resumed on ", " from its last checkpoint"

    @classmethod
    def resuming(cls, job: Job, hosts: list[str]) -> JobEvent:
        return cls(job=job, kind="resumed", text=f"{cls._RESUMING}{', '.join(hosts)}{cls._FROM}")

    @classmethod
    def resumed_from(cls, job_id: int, epochs_done: object, steps_done: object = 0) -> None:
        """The job's process restored the checkpoint of `epochs_done` epochs and `steps_done` steps of the next (a
        backup saved at a stop's step; 0: an epoch end), as its facts claim: its pending resume line says so, epochs
        and steps counted from 1, "resumed at epoch 4, step 117 on ..." (a replayed report finds none pending and
        changes nothing; a claim that is no count changes nothing either)."""
        if not _count(epochs_done):
            return
        at = f"epoch {epochs_done + 1}" + (f", step {steps_done + 1}" if _count(steps_done) and steps_done else "")
        for event in cls.objects.filter(job_id=job_id, kind="resumed", text__startswith=cls._RESUMING):
            hosts = event.text.removeprefix(cls._RESUMING).removesuffix(cls._FROM)
            event.text = f"resumed at {at} on {hosts}"
            event.save(update_fields=["text"])


def _count(value: object) -> TypeGuard[int]:
    """A count a task's facts claim: an int (not a bool) >= 0; anything else is junk."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class DecayedUsage(models.Model):
    """A user's decayed device-seconds on a cluster from their ended tasks, as of a time (orchestrator/core/
    fair_share.py): one row per user and cluster, added to at each task's end (orchestrator/usage/decay.py);
    the scheduler adds running tasks live and sums users into their accounts."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="decayed_usage")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="decayed_usage")
    value = models.FloatField(default=0.0, help_text="decayed device-seconds as of `as_of`")
    as_of = models.FloatField(default=0.0, help_text="epoch seconds")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "user"], name="decayed_usage_once")]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.cluster_id}: {self.value:.0f} device-s as of {self.as_of:.0f}"
