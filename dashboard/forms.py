from __future__ import annotations

from django import forms

from orchestrator import jobs
from orchestrator.models import Cluster, Job, Strategy


class JobForm(forms.Form):
    """The job form; every rule lives in orchestrator.jobs.validate, whose messages land next to their field."""

    name = forms.CharField(max_length=200)
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all(), empty_label=None)
    strategy = forms.ChoiceField(choices=Strategy.choices)
    script = forms.FileField(required=False, help_text="your tf.distribute training script (.py)")
    args = forms.CharField(required=False, max_length=jobs.MAX_ARGS_CHARS, help_text="e.g. --epochs 3 --out .")
    workers = forms.IntegerField(min_value=0, max_value=10_000, initial=2)
    ps = forms.IntegerField(label="Parameter servers", min_value=0, max_value=10_000, initial=0)
    devices_per_worker = forms.IntegerField(min_value=0, max_value=10_000, initial=1)
    labels = forms.CharField(required=False, max_length=500, help_text="place only on hosts with all these labels")
    max_restarts = forms.IntegerField(min_value=0, max_value=100, initial=0)
    legacy_keras = forms.BooleanField(
        required=False, initial=True, label="tf.keras is tf_keras (TF_USE_LEGACY_KERAS=1)"
    )
    startup_deadline_s = forms.IntegerField(label="Start-up deadline (s)", min_value=10, max_value=3600, initial=120)

    def build(self, owner: object) -> tuple[Job, jobs.Upload | None]:
        """The unsaved job and its upload; raises jobs.JobInvalid (e.g. for arguments that cannot be split)."""
        data = self.cleaned_data
        return jobs.new_job(owner, data["cluster"], data, data.get("script"))

    def add_job_errors(self, errors: dict[str, list[str]]) -> None:
        for field, messages in errors.items():
            for message in messages:
                self.add_error(field if field in self.fields else None, message)
