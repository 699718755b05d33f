"""The schema of a job's `diagnosis` in the API (the dict orchestrator/diagnosis/ saves on Job.diagnosis): what the
OpenAPI schema says of it. No field is required, so {} (no verdict) conforms."""

from __future__ import annotations

from rest_framework import serializers

# What the jobs list leaves out of each job's diagnosis (the job's detail has them): up to 12 evidence lines and one
# entry per other task of a gang of up to hundreds.
DETAIL_ONLY = ("evidence", "peers")


class DiagnosisPeerSerializer(serializers.Serializer):
    task = serializers.CharField(required=False, allow_blank=True)
    task_id = serializers.IntegerField(required=False, allow_null=True)
    kind = serializers.CharField(required=False, allow_blank=True)
    message = serializers.CharField(required=False, allow_blank=True)


class DiagnosisSerializer(serializers.Serializer):
    """Why the job failed or timed out (orchestrator/diagnosis/); docs/user-guide/why.md lists the kinds. No field is
    required: a job without a verdict has {}."""

    kind = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="the rule that matched (orchestrator/diagnosis/rules.py), or unknown",
    )
    title = serializers.CharField(required=False, allow_blank=True, help_text="one line, for lists and the CLI")
    message = serializers.CharField(required=False, allow_blank=True, help_text="one sentence: what happened")
    hint = serializers.CharField(required=False, allow_blank=True, help_text="what to do")
    task = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="the cause task's label; empty when the cause is the job (a time limit)",
    )
    task_id = serializers.IntegerField(required=False, allow_null=True)
    evidence = serializers.ListField(
        required=False,
        child=serializers.CharField(allow_blank=True),
        help_text="at most 12 lines: why this kind (the job's detail only)",
    )
    peers = DiagnosisPeerSerializer(
        many=True, required=False, help_text="the tasks that failed because of the cause (the job's detail only)"
    )
    at = serializers.CharField(required=False, allow_blank=True, help_text="when it was computed (ISO 8601)")
    lines_in = serializers.IntegerField(
        required=False, help_text="the attempt's log lines it was made from; made again when more came in"
    )
