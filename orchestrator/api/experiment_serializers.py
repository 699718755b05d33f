"""What a user sends to start a compare-strategies experiment, and what the API answers about one."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from contracts.limits import MAX_DEVICES_PER_WORKER, MAX_PS, MAX_WORKERS
from contracts.strategies import Strategy
from orchestrator.api.job_serializers import _JobInput, _serializer_field
from orchestrator.experiments import actions as experiments
from orchestrator.experiments import summary as experiment_summary
from orchestrator.models import Experiment, ExperimentMode, Job
from orchestrator.submit import job_fields, submission


class VariantSerializer(serializers.Serializer):
    strategy = serializers.ChoiceField(choices=[s.value for s in Strategy])
    workers = serializers.IntegerField(min_value=1, max_value=MAX_WORKERS, default=1)
    ps = serializers.IntegerField(min_value=0, max_value=MAX_PS, default=0)
    devices_per_worker = serializers.IntegerField(min_value=1, max_value=MAX_DEVICES_PER_WORKER, default=1)


class _ExperimentInput(_JobInput):
    """The job's fields but its shape (program, hyperparameters in `builtin_config`, resilience), then the variants
    and how to run them."""

    variants = VariantSerializer(many=True, help_text="two or more strategy/shape variants, run in this order")
    mode = serializers.ChoiceField(
        choices=ExperimentMode.choices,
        default=ExperimentMode.SEQUENTIAL,
        help_text="one after another, or side by side",
    )
    target_accuracy = serializers.FloatField(
        min_value=0.01, max_value=1.0, default=0.9, help_text="the accuracy whose time to reach is compared"
    )

    def build_experiment(self, owner: AbstractBaseUser) -> Experiment:
        data = dict(self.validated_data)
        cluster = data.get("cluster") or submission.default_cluster()
        if cluster is None:
            raise serializers.ValidationError({"cluster": ["No cluster is registered yet; ask an admin to add one."]})
        try:
            variants = experiments.parse_variants(data["variants"])
            base, upload = submission.new_job(owner, cluster, data, data.get("script"))
            return experiments.create(
                base=base, upload=upload, variants=variants, mode=data["mode"], target_accuracy=data["target_accuracy"]
            )
        except submission.JobInvalid as exc:
            raise serializers.ValidationError(exc.errors) from None


ExperimentInputSerializer = type(
    "ExperimentInputSerializer",
    (_ExperimentInput,),
    {spec.name: _serializer_field(spec) for spec in job_fields.FIELDS if spec.name not in experiments.VARIANT_SHAPE},
)


class ExperimentJobSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = ["id", "variant", "name", "strategy", "workers", "ps", "devices_per_worker", "state", "reason", "url"]
        read_only_fields = fields

    def get_url(self, obj: Job) -> str:
        return f"/api/jobs/{obj.pk}/"


class ExperimentSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    state = serializers.SerializerMethodField()
    variants = VariantSerializer(many=True, read_only=True)
    program = serializers.SerializerMethodField()

    class Meta:
        model = Experiment
        fields = [
            "id",
            "name",
            "owner",
            "cluster",
            "cluster_name",
            "mode",
            "target_accuracy",
            "variants",
            "program",
            "state",
            "created_at",
            "cancelled_at",
        ]
        read_only_fields = fields

    def get_state(self, obj: Experiment) -> str:
        return experiments.state_of(obj, list(obj.jobs.all()))

    @extend_schema_field(serializers.DictField())
    def get_program(self, obj: Experiment) -> dict[str, Any]:
        """What every run shares: the program (builtin and its config, or the script's hash) and its settings."""
        return dict(obj.template)


class ExperimentDetailSerializer(ExperimentSerializer):
    jobs = serializers.SerializerMethodField()
    summary = serializers.SerializerMethodField(
        help_text="per variant: mean_epoch_s, examples_per_s, scaling_efficiency, final_loss, final_accuracy, "
        "time_to_target_s, ...; the verdict; chart series (the experiment page shows these numbers)",
    )

    class Meta(ExperimentSerializer.Meta):
        fields = [*ExperimentSerializer.Meta.fields, "jobs", "summary"]
        read_only_fields = fields

    @extend_schema_field(ExperimentJobSerializer(many=True))
    def get_jobs(self, obj: Experiment) -> list[dict[str, Any]]:
        return list(ExperimentJobSerializer(obj.jobs.order_by("pk"), many=True).data)

    @extend_schema_field(serializers.DictField())
    def get_summary(self, obj: Experiment) -> dict[str, Any]:
        return experiment_summary.summarize(obj)
