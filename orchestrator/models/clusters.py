"""Clusters and the hosts in them: what an admin registers, and what each host's agent reports about itself."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models, transaction
from django.urls import reverse
from django.utils import timezone

from contracts.host_reports import HostFacts
from orchestrator.core import fair_share
from orchestrator.models.validators import (
    parse_labels,
    validate_address,
    validate_host_name,
    validate_labels,
    validate_port,
    validate_port_range,
)

BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def validate_bucket(value: str) -> None:
    if not BUCKET_NAME.match(value) or ".." in value:
        raise ValidationError("3-63 lower-case letters, digits, dots and hyphens, starting and ending alphanumeric.")


@dataclass(frozen=True)
class Recorded:
    """What Host.record_heartbeat did: whether the host came (back) online, whether the report's facts were stored
    (not when a newer report's are)."""

    came_online: bool
    facts_stored: bool


class Cluster(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    shared_dir = models.CharField(
        "shared folder",
        max_length=500,
        blank=True,
        help_text="A folder every host mounts at the same path (NFS, ...). Jobs keep checkpoints there, so a job "
        "restarted on other hosts resumes. Blank: each agent uses its own work folder (resume only on the same host).",
    )
    # Time limits (orchestrator/jobs/time_limits.py): a job that names none gets the default, none may ask for
    # more than the maximum; at the limit (and when preempted) its tasks get SIGTERM, then SIGKILL after the grace.
    default_time_limit_s = models.PositiveIntegerField("default time limit (s)", default=86_400)
    max_time_limit_s = models.PositiveIntegerField("maximum time limit (s)", default=7 * 86_400)
    stop_grace_s = models.PositiveIntegerField(
        "stop grace (s)", default=3, help_text="between SIGTERM and SIGKILL when a task is stopped (TF ignores SIGTERM)"
    )
    # Which host a device-holding task takes (orchestrator/core/assignment.py Packing): spread keeps a gang's workers
    # apart; pack (best fit) keeps whole hosts free for wide workers, which a fleet shared by jobs of mixed widths
    # needs (README "Sizing": utilization while jobs wait).
    packing = models.CharField(
        max_length=8,
        choices=[("spread", "spread: the host with the most free devices"),
                 ("pack", "pack: the host with the fewest free devices that hold the task (best fit)")],
        default="spread",
        help_text="pack for a fleet shared by jobs of mixed widths: small tasks fill used hosts, whole hosts stay "
        "free for 8-device workers",
    )  # fmt: skip
    # Fair share's memory (orchestrator/core/fair_share.py): how fast past use is forgotten. Never 0 (that would
    # forget at once and silently turn fair share off).
    fair_share_half_life_s = models.PositiveIntegerField(
        "fair-share half-life (s)",
        default=fair_share.DEFAULT_HALF_LIFE_S,
        validators=[MinValueValidator(fair_share.MIN_HALF_LIFE_S)],
        help_text="past device use counts half after this long when the queue orders jobs of one class "
        "(default 7 days, as Slurm's)",
    )
    # The cluster's object store (S3-compatible, orchestrator/objectstore/store.py): checkpoints and artifacts follow
    # the job there through presigned URLs. The credentials stay on the control plane, in a file named here, never here.
    store_endpoint = models.URLField(
        "object store endpoint",
        max_length=500,
        blank=True,
        help_text="e.g. https://s3.eu-west-1.amazonaws.com or http://minio.lab:9000. Blank: no object store.",
    )
    store_bucket = models.CharField("bucket", max_length=63, blank=True, validators=[validate_bucket])
    store_region = models.CharField("region", max_length=32, blank=True, default="us-east-1")
    store_path_style = models.BooleanField(
        "path-style addressing", default=True, help_text="endpoint/bucket/key (MinIO, most self-hosted stores)"
    )
    store_credentials_file = models.CharField(
        "credentials file",
        max_length=500,
        blank=True,
        help_text="A file on the control plane holding the access key id and secret (an AWS credentials INI with "
        "aws_access_key_id and aws_secret_access_key, or key=value lines); readable by the control plane alone.",
    )
    # Showback, not billing: the usage page and API multiply this cluster's device-hours by it (orchestrator/usage/).
    price_per_device_hour = models.DecimalField(
        "price per device-hour",
        max_digits=10,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Shown beside usage as its cost (showback; nothing is billed). Blank: no price.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("dashboard:clusters") + f"#cluster-{self.pk}"

    @property
    def has_store(self) -> bool:
        return bool(self.store_endpoint and self.store_bucket)

    def clean(self) -> None:
        super().clean()
        store = (self.store_endpoint, self.store_bucket, self.store_credentials_file)
        if any(store) and not all(store):
            raise ValidationError("An object store needs its endpoint, bucket and credentials file together.")
        if self.store_credentials_file and not self.store_credentials_file.startswith("/"):
            raise ValidationError({"store_credentials_file": "An absolute path on the control plane."})


class HostStatus(models.TextChoices):
    UNKNOWN = "unknown", "never connected"
    ONLINE = "online", "online"
    OFFLINE = "offline", "offline"


def label_set(labels: str) -> frozenset[str]:
    return frozenset(parse_labels(labels)) if labels else frozenset()


def device_slots(gpus: list[Any], cpu_slots: int | None, cpu_count: int | None) -> int:
    """Devices a job may take on a host: its GPUs, else logical CPU devices (configured, else its CPU count)."""
    if gpus:
        return len(gpus)
    return cpu_slots if cpu_slots is not None else (cpu_count or 0)


class Host(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="hosts")
    name = models.CharField(max_length=63, validators=[validate_host_name])
    address = models.CharField(
        max_length=253,
        validators=[validate_address],
        help_text="IP address or DNS name other hosts reach this one at (goes into TF_CONFIG).",
    )
    port_min = models.PositiveIntegerField(
        "first port", validators=[validate_port], help_text="First port TF tasks on this host may listen on."
    )
    port_max = models.PositiveIntegerField(
        "last port", validators=[validate_port], help_text="Last port (inclusive) of the range."
    )
    cpu_slots = models.PositiveIntegerField(
        "CPU device slots",
        null=True,
        blank=True,
        help_text="Logical CPU devices this host offers when it has no GPU; blank means its CPU count.",
    )
    labels = models.CharField(
        max_length=500,
        blank=True,
        validators=[validate_labels],
        help_text="Comma-separated, e.g. gpu, fast-net.",
    )

    # Reported by the agent; never edited by hand.
    status = models.CharField(max_length=16, choices=HostStatus.choices, default=HostStatus.UNKNOWN)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    # Retention (orchestrator/metrics/retention.py): this host's samples older than this (wall seconds) are thinned
    # already.
    samples_thinned_to = models.FloatField(default=0.0)
    cpu_count = models.PositiveIntegerField(null=True, blank=True)
    memory_total_mb = models.PositiveBigIntegerField(null=True, blank=True)
    gpus = models.JSONField(default=list, blank=True)
    gpu_error = models.CharField(max_length=500, blank=True)
    # The task environments its agent probed (contracts/protocol.py EnvironmentFacts, as dicts): placement reads which
    # are ok (orchestrator/scheduler/fleet_state.py), the host's page shows them.
    environments = models.JSONField(default=list, blank=True)
    tf_version = models.CharField(max_length=50, blank=True)
    agent_version = models.CharField(max_length=50, blank=True)
    agent_hostname = models.CharField(max_length=255, blank=True)
    agent_pid = models.PositiveIntegerField(null=True, blank=True)
    agent_started_at = models.DateTimeField(null=True, blank=True)
    # The wire protocol its agent speaks (contracts/signing.py), from its last accepted message: orders to it are
    # signed in it and carry only what it knows (orchestrator/jobs/dispatch.py). Null: no message yet.
    agent_protocol = models.PositiveSmallIntegerField(null=True, blank=True)
    # Why its agent's messages are refused though genuine (an agent too old, or newer than this control plane:
    # contracts/signing.py UnsupportedProtocol); cleared by its next accepted message. The host's page shows it.
    agent_refusal = models.CharField(max_length=300, blank=True)
    # The sealed time (the agent's clock) of the report the facts above came from: an older report, late or
    # replayed, does not replace them (record_heartbeat).
    facts_at = models.FloatField(null=True, blank=True)

    # The key this host's messages are MACed with (derived from its token by HKDF; the token itself is never stored),
    # encrypted with a key of the control plane's (orchestrator/identity/keys.py): without that key, a database dump
    # can forge no message of the host's. Blank: no token issued yet (or issued before protocol 3).
    agent_key = models.CharField(max_length=200, editable=False, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="host_name_unique_in_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}" if self.cluster_id else self.name

    # --- validation shared by admin and API ---
    def clean(self) -> None:
        validate_port_range(self.port_min, self.port_max)
        if self.labels:
            self.labels = ", ".join(parse_labels(self.labels))
        if self.name:
            # A host's broker keys and user are named after it (contracts/broker.py): a name lives in one cluster.
            clash = Host.objects.filter(name=self.name).exclude(pk=self.pk).select_related("cluster").first()
            if clash is not None:
                where = "this cluster" if clash.cluster_id == self.cluster_id else f"cluster {clash.cluster.name}"
                raise ValidationError({"name": f"A host named {self.name} is already registered in {where}."})

    # --- derived facts ---
    @property
    def label_set(self) -> frozenset[str]:
        return label_set(self.labels)

    @property
    def device_slots(self) -> int:
        return device_slots(self.gpus, self.cpu_slots, self.cpu_count)

    # --- state changes driven by agents and the watchdog ---
    @staticmethod
    def facts_fields(facts: HostFacts) -> dict[str, Any]:
        """The columns an agent's facts are stored in."""
        return {
            "cpu_count": facts.cpu_count,
            "memory_total_mb": facts.memory_total_mb,
            "gpus": [
                {"index": g.index, "name": g.name, "memory_total_mb": g.memory_total_mb, "uuid": g.uuid}
                for g in facts.gpus
            ],
            "gpu_error": facts.gpu_error,
            "environments": [asdict(e) for e in facts.environments],
            "tf_version": facts.tf_version,
            "agent_version": facts.agent_version,
            "agent_hostname": facts.hostname,
            "agent_pid": facts.pid or None,
        }

    def says_the_same(self, facts: HostFacts) -> bool:
        """Whether the host is online and these facts are what is stored: a heartbeat then only moves
        `last_heartbeat` (orchestrator/agents/heartbeats.py does that for a whole batch in one statement)."""
        return self.status == HostStatus.ONLINE and all(
            getattr(self, name) == value for name, value in self.facts_fields(facts).items()
        )

    def record_heartbeat(
        self, facts: HostFacts, *, hello: bool, sent_at: float, now: datetime | None = None
    ) -> Recorded:
        """Store the agent's report, sealed at `sent_at`: its liveness always, its facts only when no newer report's
        are stored (a late or replayed report must not undo a newer one)."""
        now = now or timezone.now()
        alive: dict[str, Any] = {"last_heartbeat": now}
        if hello:
            alive["agent_started_at"] = now
        fields = {**alive, **self.facts_fields(facts), "facts_at": sent_at}
        newer = models.Q(facts_at__isnull=True) | models.Q(facts_at__lte=sent_at)
        # The steady case, one statement: a host already online stays online (filtered on it, so a host the watchdog
        # flipped offline since it was read falls through to the transition below).
        if self.status == HostStatus.ONLINE and Host.objects.filter(newer, pk=self.pk, status=HostStatus.ONLINE).update(
            **fields
        ):
            return Recorded(came_online=False, facts_stored=True)
        # Facts first, then the conditional status flip: exactly one heartbeat reports the transition however many
        # race, and both commit together, so nobody sees a host online without its facts.
        with transaction.atomic():
            stored = bool(Host.objects.filter(newer, pk=self.pk).update(**fields))
            if not stored:
                Host.objects.filter(pk=self.pk).update(**alive)
            online = Host.objects.filter(pk=self.pk).exclude(status=HostStatus.ONLINE).update(status=HostStatus.ONLINE)
        return Recorded(came_online=bool(online), facts_stored=stored)

    @classmethod
    def mark_silent_offline(cls, cutoff: datetime) -> list[tuple[int, str]]:
        """Flip every online host whose last heartbeat is older than `cutoff` to offline; returns (id, name) of each.

        The update is filtered on the old state, so two watchdogs racing (or a retried task) flip each host once.
        """
        stale = list(cls.objects.filter(status=HostStatus.ONLINE, last_heartbeat__lt=cutoff).values_list("pk", "name"))
        flipped = []
        for pk, name in stale:
            if cls.objects.filter(pk=pk, status=HostStatus.ONLINE, last_heartbeat__lt=cutoff).update(
                status=HostStatus.OFFLINE
            ):
                flipped.append((pk, name))
        return flipped


class HostSample(models.Model):
    """CPU, memory and GPU readings an agent took at `ts` (wall seconds)."""

    id = models.BigAutoField(primary_key=True)
    # Also ON DELETE CASCADE in PostgreSQL (migration 0034): a sample stored while the host is being deleted goes
    # with it. A migration that alters this field makes Django write the constraint again, without: redo 0034.
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="samples")
    ts = models.FloatField()
    cpu_percent = models.FloatField(null=True)
    memory_used_mb = models.PositiveBigIntegerField(null=True)
    memory_total_mb = models.PositiveBigIntegerField(null=True)
    gpus = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host", "ts"], name="host_sample_unique")]
        indexes = [models.Index(fields=["host", "ts"])]

    def __str__(self) -> str:
        return f"{self.host_id}@{self.ts}"
