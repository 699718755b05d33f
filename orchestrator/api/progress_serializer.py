"""The API's schema of Job.progress (orchestrator/core/progress.py says what each figure means)."""

from __future__ import annotations

from rest_framework import serializers


class ProgressSerializer(serializers.Serializer):
    """How far the job is (orchestrator/core/progress.py, kept at ingest from the task that speaks for the job); {}
    before its first epoch. No field is required: {} conforms."""

    epoch = serializers.IntegerField(required=False, help_text="the epoch in progress (from 1), or the last finished")
    epochs = serializers.IntegerField(required=False, allow_null=True, help_text="the run's epochs; null: unknown")
    step = serializers.IntegerField(required=False, help_text="the run's global step")
    steps = serializers.IntegerField(
        required=False, allow_null=True, help_text="epochs x steps per epoch; null when either is unknown"
    )
    examples_per_s = serializers.FloatField(required=False, allow_null=True, help_text="the whole job's, latest")
    eta_s = serializers.FloatField(
        required=False,
        allow_null=True,
        help_text="seconds left as of `at`: the median of the run's last 3 epochs (its first left out once another "
        "ended) x the epochs left, less the part of the current epoch done; null when the epochs are unknown or "
        "nothing was measured yet",
    )
    resumed_from_epoch = serializers.IntegerField(required=False, help_text="epochs done before this run started")
    at = serializers.FloatField(required=False, help_text="when its newest figure was measured (unix time)")
    text = serializers.CharField(
        required=False,
        help_text='in words, as the pages say it: "epoch 3/10 · step 90/300 · 1,234 examples/s · ETA 2 min"',
    )
    short = serializers.CharField(required=False, help_text='the jobs list\'s: "epoch 3/10 · ETA 2 min"')
