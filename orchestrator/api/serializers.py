from __future__ import annotations

import shlex
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from orchestrator.agents.join import control_plane_url
from orchestrator.identity import tokens
from orchestrator.identity.broker_users import agent_server_url
from orchestrator.models import Cluster, Host


class EnvironmentSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="what a job's `environment` names")
    labels = serializers.CharField()
    is_default = serializers.BooleanField(help_text="a job that names none runs in it")


class ClusterSerializer(serializers.ModelSerializer):
    host_count = serializers.IntegerField(source="hosts.count", read_only=True)
    environments = EnvironmentSerializer(
        many=True, read_only=True, help_text="its task environments (each host's page shows what it found in them)"
    )

    class Meta:
        model = Cluster
        fields = ["id", "name", "description", "host_count", "environments", "created_at"]
        read_only_fields = ["created_at"]


class GpuSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    name = serializers.CharField()
    memory_total_mb = serializers.IntegerField()
    uuid = serializers.CharField()


class HostSerializer(serializers.ModelSerializer):
    gpus = GpuSerializer(many=True, read_only=True)
    devices = serializers.SerializerMethodField()
    device_slots = serializers.IntegerField(read_only=True)

    class Meta:
        model = Host
        fields = [
            "id",
            "cluster",
            "name",
            "address",
            "port_min",
            "port_max",
            "cpu_slots",
            "labels",
            "status",
            "last_heartbeat",
            "cpu_count",
            "memory_total_mb",
            "gpus",
            "devices",
            "device_slots",
            "gpu_error",
            "environments",
            "tf_version",
            "agent_version",
            "created_at",
        ]
        read_only_fields = [
            "cluster",
            "status",
            "last_heartbeat",
            "cpu_count",
            "memory_total_mb",
            "gpu_error",
            "environments",
            "tf_version",
            "agent_version",
            "created_at",
        ]
        # Uniqueness is checked in Host.clean with a message that names the clash.
        validators: list[Any] = []

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_devices(self, obj: Host) -> list[str]:
        if obj.gpus:
            return [f"GPU {g['index']}: {g['name']}, {g['memory_total_mb']} MiB" for g in obj.gpus]
        return [f"CPU slot {i}" for i in range(obj.device_slots)]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # Run the model's own validation so the API refuses exactly what the admin refuses, with the same words.
        instance = self.instance or Host(cluster=self.context["cluster"])
        for key, value in attrs.items():
            setattr(instance, key, value)
        try:
            instance.clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(serializers.as_serializer_error(exc)) from exc
        attrs["labels"] = instance.labels
        return attrs


class HostCreatedSerializer(HostSerializer):
    """The response to a host registration: the only place its agent token ever appears."""

    agent_token = serializers.SerializerMethodField()
    agent_command = serializers.SerializerMethodField()
    agent_commands = serializers.SerializerMethodField()

    class Meta(HostSerializer.Meta):
        fields = [*HostSerializer.Meta.fields, "agent_token", "agent_command", "agent_commands"]

    def get_agent_token(self, obj: Host) -> str:
        return self.context["token"]

    def get_agent_command(self, obj: Host) -> str:
        # The token goes into the file the command names (mode 0600), never onto a command line.
        return shlex.join(tokens.agent_command(obj, agent_server_url()))

    @extend_schema_field(
        serializers.DictField(
            child=serializers.CharField(),
            help_text="shell lines that put the host's agent in service from its own distribution: `install`, "
            "`join` (the token goes into the file it names, mode 0600), `run`",
        )
    )
    def get_agent_commands(self, obj: Host) -> dict[str, str]:
        return tokens.agent_commands(obj, control_plane_url(self.context["request"]))


class QueueRowSerializer(serializers.Serializer):
    """One waiting job in a cluster's queue (orchestrator/scheduler/queue_view.py): name and reason only for its owner
    and staff."""

    position = serializers.IntegerField()
    id = serializers.IntegerField()
    name = serializers.CharField()
    owner = serializers.CharField()
    priority = serializers.CharField()
    state = serializers.CharField()
    held = serializers.BooleanField()
    strategy = serializers.CharField()
    workers = serializers.IntegerField()
    ps = serializers.IntegerField()
    devices = serializers.IntegerField()
    time_limit_s = serializers.IntegerField()
    reason = serializers.CharField()
    expected_start = serializers.DateTimeField(
        allow_null=True, help_text="the latest it starts (null: not planned yet)"
    )
    reservation = serializers.JSONField(help_text='{"at": time, "hosts": {host: [device, ...]}} or {}')
    submitted_at = serializers.DateTimeField()
    fair_share = serializers.FloatField(
        help_text="its account's fair-share factor 2^(-usage/share), 1 (used nothing) to 0: higher goes first "
        "within a class"
    )
    decayed_usage_h = serializers.FloatField(help_text="its account's decayed device-hours (the cluster's half-life)")
    visible = serializers.BooleanField(help_text="whether you may open the job")
