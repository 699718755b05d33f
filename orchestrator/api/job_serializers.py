from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from contracts.terminal_text import render_lines
from orchestrator import limits
from orchestrator.api.diagnosis_serializer import DETAIL_ONLY, DiagnosisSerializer
from orchestrator.api.progress_serializer import ProgressSerializer
from orchestrator.core import progress as progress_words
from orchestrator.diagnosis import store
from orchestrator.insights import input_bound, slow_worker
from orchestrator.metrics import drops
from orchestrator.models import Cluster, Job, JobState, Task
from orchestrator.scheduler import protection
from orchestrator.submit import job_fields, submission
from orchestrator.submit.job_fields import JobField

log = logging.getLogger(__name__)


@extend_schema_field(serializers.ListField(child=serializers.CharField()))
class ArgsField(serializers.Field):
    """A list of strings, or one string split like a shell would (multipart forms can only send strings)."""

    def to_internal_value(self, data: Any) -> list[str]:
        if isinstance(data, list) and all(isinstance(v, str | int | float) for v in data):
            args = [str(v) for v in data]
            # The same bound as for one string: arguments travel in every launch order and TF_CONFIG-sized rows.
            if sum(len(a) + 1 for a in args) > submission.MAX_ARGS_CHARS:
                raise serializers.ValidationError(f"Arguments are limited to {submission.MAX_ARGS_CHARS} characters.")
            return submission.parse_args(args)
        if isinstance(data, str):
            try:
                return submission.parse_args(data)
            except submission.JobInvalid as exc:
                raise serializers.ValidationError(exc.errors["args"]) from None
        raise serializers.ValidationError("Give a list of strings or one string.")

    def to_representation(self, value: list[str]) -> list[str]:
        return value


@extend_schema_field(serializers.DictField())
class ObjectField(serializers.Field):
    """A JSON object, given as an object (JSON requests) or as JSON text (multipart forms)."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, str):
            try:
                data = json.loads(data or "{}")
            except json.JSONDecodeError as exc:
                raise serializers.ValidationError(f"Not JSON: {exc.msg}.") from None
        if not isinstance(data, dict):
            raise serializers.ValidationError("Give a JSON object.")
        return data

    def to_representation(self, value: dict[str, Any]) -> dict[str, Any]:
        return value


@extend_schema_field(serializers.DictField(child=serializers.CharField()))
class EnvField(ObjectField):
    """The job's own environment variables: an object of names to string values (JSON text in a multipart form).
    Which names and how much: contracts/job_env.py, checked with the rest of the job (submission.validate)."""


class _JobInput(serializers.Serializer):
    """What a user sends to create (or plan) a job: multipart with a `script` file, or JSON naming a `builtin`."""

    cluster = serializers.PrimaryKeyRelatedField(
        queryset=Cluster.objects.all(), required=False, help_text="defaults to the first cluster"
    )
    script = serializers.FileField(required=False, write_only=True, help_text="the training script (.py)")
    builtin = serializers.CharField(required=False, allow_blank=True, max_length=64)
    builtin_config = ObjectField(required=False, default=dict)
    args = ArgsField(
        required=False,
        default=list,
        help_text='a list ["--epochs", "3"] or one string "--epochs 3" (split like a shell)',
    )
    env = EnvField(
        required=False,
        default=dict,
        help_text="environment variables every task of the job gets, name -> value; reserved names (TF_CONFIG, "
        "TFDASH_*, LD_PRELOAD, PYTHONPATH, ...) are refused",
    )

    def validate_script(self, value: Any) -> Any:
        # Refused on the size the upload declares, before anything reads it; the message gives the real size.
        too_large = limits.script_size_problem(value.size) if value is not None else None
        if too_large:
            raise serializers.ValidationError(too_large)
        return value

    def build(self, owner: AbstractBaseUser, *, require_program: bool = True) -> tuple[Job, submission.Upload | None]:
        data = self.validated_data
        cluster = data.get("cluster") or submission.default_cluster()
        if cluster is None:
            raise serializers.ValidationError({"cluster": ["No cluster is registered yet; ask an admin to add one."]})
        try:
            job, upload = submission.new_job(owner, cluster, data, data.get("script"))
        except submission.JobInvalid as exc:
            raise serializers.ValidationError(exc.errors) from None
        try:
            submission.validate(job, upload, require_program=require_program)
        except submission.JobInvalid as exc:
            raise serializers.ValidationError(exc.errors) from None
        return job, upload


def _serializer_field(spec: JobField) -> serializers.Field:
    """The API's input for one of the job's fields (orchestrator/submit/job_fields.py); every field but the name
    has its default."""
    common: dict[str, Any] = {"help_text": spec.help or None}
    if not spec.required:
        common["default"] = spec.default
    if spec.kind is bool:  # one whose default is None (the preflight) takes null: the default rule applies
        return serializers.BooleanField(allow_null=spec.default is None and not spec.required, **common)
    if spec.choices:
        return serializers.ChoiceField(choices=spec.choices, **common)
    if spec.kind is int:
        return serializers.IntegerField(min_value=spec.min, max_value=spec.max, **common)
    return serializers.CharField(max_length=spec.max_length, allow_blank=not spec.required, **common)


# What a user sends to create (or plan) a job: the job's fields, then where and what to run.
JobInputSerializer = type(
    "JobInputSerializer", (_JobInput,), {spec.name: _serializer_field(spec) for spec in job_fields.FIELDS}
)


class LogLineSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    stream = serializers.CharField()
    text = serializers.CharField()


class LogPageSerializer(serializers.Serializer):
    lines = LogLineSerializer(many=True)
    next = serializers.IntegerField(help_text="the cursor to pass as `since` for what comes after")
    more = serializers.BooleanField(help_text="true when this page was full: ask again at once")


class TaskSerializer(serializers.ModelSerializer):
    host = serializers.CharField(source="host.name", default=None, allow_null=True, read_only=True)
    address = serializers.CharField(source="host.address", default=None, allow_null=True, read_only=True)
    logs_url = serializers.SerializerMethodField()
    output_dropped = serializers.SerializerMethodField()
    pid = serializers.IntegerField(
        source="live_pid", read_only=True, allow_null=True, help_text="the process id while the task is active"
    )

    class Meta:
        model = Task
        fields = [
            "id",
            "attempt",
            "type",
            "index",
            "host",
            "address",
            "port",
            "devices",
            "state",
            "exit_code",
            "pid",
            "detail",
            "facts",
            "tf_config",
            "started_at",
            "listening_at",
            "finished_at",
            "logs_url",
            "output_dropped",
        ]
        read_only_fields = fields

    def get_logs_url(self, obj: Task) -> str:
        return f"/api/jobs/{obj.job_id}/logs/{obj.pk}/"

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_output_dropped(self, obj: Task) -> dict[str, int]:
        """What its agent dropped of this task's output for the per-task bounds: artifacts, artifact_bytes,
        log_lines, metric_lines."""
        return drops.of_task(obj)


class PrioritySerializer(serializers.Serializer):
    priority = serializers.CharField(max_length=32, help_text="a priority class's name")


class JobEventSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    kind = serializers.CharField()
    text = serializers.CharField()


class FailureSerializer(serializers.Serializer):
    task = serializers.CharField()
    task_id = serializers.IntegerField()
    exit_code = serializers.IntegerField(allow_null=True)
    detail = serializers.CharField()
    log_tail = serializers.ListField(child=serializers.CharField())


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    script_name = serializers.CharField(source="script.filename", default=None, allow_null=True, read_only=True)
    script_sha256 = serializers.CharField(source="script_id", default=None, allow_null=True, read_only=True)
    failure = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField(help_text="epoch k of N, step, examples/s and ETA; {} before any")
    diagnosis = serializers.SerializerMethodField(help_text="why it failed or timed out; {} when not (none yet)")
    insights = serializers.SerializerMethodField(
        help_text="what the workers' measurements say (orchestrator/insights/): slow_worker and input (input-bound? "
        "per worker) on a job's own page"
    )
    priority = serializers.CharField(read_only=True, help_text="the priority class's name")
    events = JobEventSerializer(many=True, read_only=True, help_text="what the state alone does not tell")
    protected_until = serializers.SerializerMethodField(
        help_text="a running job that could be preempted: the end of its class's minimum run time while inside it "
        "(null otherwise; preemption_shielded: protected until it ends)"
    )
    output_dropped = serializers.SerializerMethodField(
        help_text="what the agents dropped of its tasks' output for the per-task bounds (empty: nothing)"
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "owner",
            "cluster",
            "cluster_name",
            "strategy",
            "program_kind",
            "script_name",
            "script_sha256",
            "builtin",
            "builtin_config",
            "args",
            "env",
            "workers",
            "ps",
            "devices_per_worker",
            "labels",
            "environment",
            "requirements",
            "max_restarts",
            "restart_policy",
            "progress_timeout_s",
            "legacy_keras",
            "startup_deadline_s",
            "time_limit_s",
            "priority",
            "held",
            "preflight",
            "preflight_for",
            "expected_start",
            "reservation",
            "preemptions",
            "preemption_shielded",
            "protected_until",
            "borrowing",
            "events",
            "state",
            "reason",
            "attempt",
            "restarts",
            "restart_reason",
            "progress",
            "failure",
            "diagnosis",
            "insights",
            "output_dropped",
            "facts",
            "created_at",
            "placed_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_protected_until(self, obj: Job) -> datetime | None:
        shelter = protection.protected(obj)
        return shelter.until if shelter else None

    def get_output_dropped(self, obj: Job) -> str:
        return drops.job_note(obj)

    @extend_schema_field(ProgressSerializer())
    def get_progress(self, obj: Job) -> dict[str, Any]:
        stored = obj.progress if isinstance(obj.progress, dict) else {}  # the row's own JSON: no query per job
        if not stored:
            return {}
        # The words the pages use, as of now (the ETA less the time since it was measured): the CLI prints them, so
        # the rule lives once, here (orchestrator/core/progress.py describe).
        running, now = obj.state == JobState.RUNNING, time.time()
        text = progress_words.describe(stored, now=now, running=running)
        return {**stored, "text": text, "short": progress_words.describe(stored, now=now, running=running, short=True)}

    @extend_schema_field(DiagnosisSerializer())
    def get_diagnosis(self, obj: Job) -> dict[str, Any]:
        stored = obj.diagnosis if isinstance(obj.diagnosis, dict) else {}
        if self.parent is not None:
            # In a list: the row's own JSON, with no query per job, less its evidence lines and peers (a wide gang's
            # peers would weigh more than the rest of the page); the detail has them.
            return {key: value for key, value in stored.items() if key not in DETAIL_ONLY}
        try:  # one job (detail, cancel): as the page shows it, made now if its end's has not landed
            with transaction.atomic():  # a savepoint: a failure inside leaves the request's transaction usable
                return store.current(obj)
        except Exception:  # a verdict explains; making it must never fail the request
            log.exception("job %s: could not make its verdict; answering the stored one", obj.pk)
            return stored

    @extend_schema_field(serializers.DictField())
    def get_insights(self, obj: Job) -> dict[str, Any]:
        stored = obj.insights if isinstance(obj.insights, dict) else {}
        if getattr(self.context.get("view"), "action", None) != "retrieve":
            return stored  # a list: the row's own JSON, no query per job
        # Read time: a few bounded queries each.
        return {**stored, "slow_worker": slow_worker.judge(obj), "input": input_bound.judge(obj)}

    @extend_schema_field(FailureSerializer(allow_null=True))
    def get_failure(self, obj: Job) -> dict[str, Any] | None:
        task = obj.failed_task
        if task is None:
            return None
        return {
            "task": task.label,
            "task_id": task.pk,
            "exit_code": task.exit_code,
            "detail": task.detail,
            "log_tail": render_lines([line.text for line in task.log_tail()]),  # a progress bar at its last state
        }


class PlanTaskSerializer(serializers.Serializer):
    type = serializers.CharField()
    index = serializers.IntegerField()
    host = serializers.CharField()
    address = serializers.CharField()
    port = serializers.IntegerField(allow_null=True)
    devices = serializers.ListField(child=serializers.IntegerField())
    tf_config = serializers.JSONField(allow_null=True)


class PlanSerializer(serializers.Serializer):
    fits_now = serializers.BooleanField()
    reason = serializers.CharField(allow_blank=True)
    tasks = PlanTaskSerializer(many=True)


class MetricsPageSerializer(serializers.Serializer):
    columns = serializers.ListField(child=serializers.CharField())
    points = serializers.ListField(child=serializers.ListField())
    next = serializers.IntegerField(help_text="the cursor to pass as `since` for what comes after")
    more = serializers.BooleanField(help_text="true when this page was full: ask again at once")


class HostWindowSerializer(serializers.Serializer):
    host = serializers.CharField()
    start = serializers.FloatField(help_text="wall seconds: the host's first task start, less the margin")
    end = serializers.FloatField(allow_null=True, help_text="its last task end plus the margin; null while one runs")


class HostSampleSerializer(serializers.Serializer):
    host = serializers.CharField()
    ts = serializers.FloatField()
    cpu_percent = serializers.FloatField(allow_null=True)
    memory_used_mb = serializers.IntegerField(allow_null=True)
    memory_total_mb = serializers.IntegerField(allow_null=True)
    gpus = serializers.ListField(child=serializers.DictField(), help_text="per GPU: index, utilization_percent, ...")


class HostSamplesSerializer(serializers.Serializer):
    windows = HostWindowSerializer(many=True)
    samples = HostSampleSerializer(many=True)


class ArtifactSerializer(serializers.Serializer):
    name = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()
    created_at = serializers.DateTimeField()
    url = serializers.CharField()
