"""Clusters and the hosts in them: what an admin registers, and what each host's agent reports about itself."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.urls import reverse
from django.utils import timezone

from contracts.protocol import HostFacts
from contracts.signing import agent_mac_key
from orchestrator.agents import keys, tokens
from orchestrator.models.validators import (
    parse_labels,
    validate_address,
    validate_host_name,
    validate_labels,
    validate_port,
    validate_port_range,
)


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
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("dashboard:clusters") + f"#cluster-{self.pk}"


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
    # Retention (orchestrator/retention.py): this host's samples older than this (wall seconds) are thinned already.
    samples_thinned_to = models.FloatField(default=0.0)
    cpu_count = models.PositiveIntegerField(null=True, blank=True)
    memory_total_mb = models.PositiveBigIntegerField(null=True, blank=True)
    gpus = models.JSONField(default=list, blank=True)
    gpu_error = models.CharField(max_length=500, blank=True)
    tf_version = models.CharField(max_length=50, blank=True)
    agent_version = models.CharField(max_length=50, blank=True)
    agent_hostname = models.CharField(max_length=255, blank=True)
    agent_pid = models.PositiveIntegerField(null=True, blank=True)
    agent_started_at = models.DateTimeField(null=True, blank=True)

    # The key this host's messages are MACed with (derived from its token by HKDF; the token itself is never stored),
    # encrypted with a key of the control plane's (orchestrator/agents/keys.py): without that key, a database dump
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
            # Agent queues are named agent.<host>, so a name may live in only one cluster.
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

    # --- the agent token ---
    def issue_token(self) -> str:
        """Set a fresh token and return it in plain text: the only time anyone sees it. Only the key derived from it
        is kept (encrypted); the host's name is part of that derivation, so a renamed host needs a new token."""
        token = tokens.new_token()
        self.agent_key = keys.seal_host_key(self.name, agent_mac_key(token, self.name))
        return token

    def mac_key(self) -> bytes | None:
        """The key this host's messages must be MACed with; None when it has none (or it does not open)."""
        return keys.open_host_key(self.name, self.agent_key) if self.agent_key else None

    def check_token(self, token: str) -> bool:
        key = self.mac_key()
        return key is not None and secrets.compare_digest(key, agent_mac_key(token, self.name))

    def agent_command(self, server: str, token_file: str = "tfdash-agent.token") -> list[str]:  # noqa: S107 - a file name
        """How to start this host's agent. The token goes into `token_file` (mode 0600), never onto the command line
        (a flag shows in `ps`); `--control-key` is the control plane's public key, which the agent pins to check
        every order; `--shared-root` the cluster's shared folder, the only place besides its workdir where the agent
        makes a job's folder."""
        shared = ["--shared-root", self.cluster.shared_dir] if self.cluster.shared_dir else []
        return [
            "python",
            "-m",
            "worker_agent",
            "--server",
            server,
            "--host",
            self.name,
            "--token-file",
            token_file,
            "--control-key",
            keys.control_public_key(),
            "--port-range",
            f"{self.port_min}-{self.port_max}",
            *shared,
        ]

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

    def record_heartbeat(self, facts: HostFacts, *, hello: bool, now: datetime | None = None) -> bool:
        """Store the agent's report; returns True when this heartbeat brought the host (back) online."""
        now = now or timezone.now()
        fields: dict[str, Any] = {"last_heartbeat": now, **self.facts_fields(facts)}
        if hello:
            fields["agent_started_at"] = now
        # The steady case, one statement: a host already online stays online (filtered on it, so a host the watchdog
        # flipped offline since it was read falls through to the transition below).
        if self.status == HostStatus.ONLINE and Host.objects.filter(pk=self.pk, status=HostStatus.ONLINE).update(
            **fields
        ):
            return False
        # Facts first, then the conditional status flip: exactly one heartbeat reports the transition however many
        # race, and both commit together, so nobody sees a host online without its facts.
        with transaction.atomic():
            Host.objects.filter(pk=self.pk).update(**fields)
            return bool(
                Host.objects.filter(pk=self.pk).exclude(status=HostStatus.ONLINE).update(status=HostStatus.ONLINE)
            )

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
