from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from django import forms

from orchestrator.control import job_fields, scheduling, submission
from orchestrator.control.job_fields import JobField
from orchestrator.models import Cluster, Job, Strategy


def _form_field(spec: JobField) -> forms.Field:
    """The form's input for one of the job's fields (orchestrator/control/job_fields.py)."""
    common: dict[str, Any] = {"label": spec.label, "help_text": spec.help, "initial": spec.default}
    if spec.kind is bool:
        return forms.BooleanField(required=False, **common)
    if spec.choices:
        if spec.optional_in_form:
            return forms.TypedChoiceField(choices=spec.choices, required=False, empty_value=None, **common)
        return forms.ChoiceField(choices=spec.choices, **common)
    if spec.kind is int:
        return forms.IntegerField(min_value=spec.min, max_value=spec.max, required=not spec.optional_in_form, **common)
    return forms.CharField(max_length=spec.max_length, required=spec.required, **common)


class _JobForm(forms.Form):
    """The job form: the job's fields from their one definition (JobForm, below), plus where and what to run. What no
    single field can check (the shape against the strategy, the cluster) is submission.validate's, whose messages land
    next to their field."""

    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all(), empty_label=None)
    script = forms.FileField(required=False, help_text="your tf.distribute training script (.py)")
    args = forms.CharField(required=False, max_length=submission.MAX_ARGS_CHARS, help_text="e.g. --epochs 3 --out .")
    field_order = ["name", "cluster", "strategy", "script", "args"]  # then the rest of the job's fields

    def build(self, owner: object) -> tuple[Job, submission.Upload | None]:
        """The unsaved job and its upload; raises submission.JobInvalid (e.g. for arguments that cannot be split)."""
        data = self.cleaned_data
        return submission.new_job(owner, data["cluster"], data, data.get("script"))

    def add_job_errors(self, errors: dict[str, list[str]]) -> None:
        for field, messages in errors.items():
            for message in messages:
                self.add_error(field if field in self.fields else None, message)


JobForm = type("JobForm", (_JobForm,), {spec.name: _form_field(spec) for spec in job_fields.FIELDS})


def initial_from(job: Job) -> dict[str, Any]:
    """The form's fields as `job` had them, to run it again (with another strategy, say). A file field cannot be
    pre-filled: the job's program (script or built-in) is carried by the view instead, unless a script is chosen."""
    return {
        **{name: getattr(job, name) for name in job_fields.SHAPE_FIELDS},
        "name": f"{job.name} (again)"[: job_fields.MAX_NAME_CHARS],
        "cluster": job.cluster_id,
        "args": shlex.join(str(a) for a in job.args) if isinstance(job.args, list) else "",
    }


# TensorFlow's decision table (the tf.distribute guide), one line per strategy, shown next to the choice.
STRATEGY_HINTS: dict[str, str] = {
    Strategy.MIRRORED: "One machine with several devices: one process, gradients all-reduced across its devices.",
    Strategy.MULTI_WORKER_MIRRORED: (
        "Several machines, alike, on a fast interconnect: synchronous all-reduce; every step waits for the slowest."
    ),
    Strategy.PARAMETER_SERVER: (
        "Many or unlike workers, stragglers, asynchronous updates acceptable: a chief coordinates, ps tasks hold the "
        "variables, workers never wait for each other."
    ),
}


@dataclass(frozen=True)
class StrategyFit:
    strategy: str
    label: str
    hint: str
    now: str  # what the chosen cluster offers this strategy right now
    suggested: bool


@dataclass(frozen=True)
class ClusterGuidance:
    cluster_id: int
    name: str
    fits: list[StrategyFit]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def cluster_guidance(cluster: Cluster) -> ClusterGuidance:
    """Which strategy the cluster suits now, from its online hosts and the device slots running tasks leave free."""
    online = [h for h in scheduling.host_states(cluster.hosts.all()) if h.online]
    free = {h.name: len(set(h.device_ids) - h.used_devices) for h in online}
    with_room = [name for name, n in free.items() if n > 0]
    largest = max(free.items(), key=lambda item: (item[1], item[0]), default=("", 0))
    shapes = {(len(h.device_ids), h.gpu) for h in online}
    alike = len(shapes) <= 1
    kinds = ", ".join(f"{n} {'GPU' if gpu else 'CPU slot'}{'' if n == 1 else 's'}" for n, gpu in sorted(shapes))
    hosts_now = f"{_plural(len(online), 'host')} online, {_plural(len(with_room), 'host')} with free slots"

    if largest[1]:
        mirrored_now = f"largest host: {largest[0]}, {_plural(largest[1], 'device slot')} free"
    else:
        mirrored_now = "no online host has a free device slot now"
    multi_now = hosts_now + (f"; hosts alike ({kinds} each)" if alike and online else f"; hosts differ ({kinds})")
    ps_now = f"{hosts_now}; {sum(free.values())} device slots free in all"
    fits = {
        Strategy.MIRRORED: (mirrored_now, len(with_room) <= 1 and largest[1] > 1),
        Strategy.MULTI_WORKER_MIRRORED: (multi_now, len(with_room) > 1 and alike),
        Strategy.PARAMETER_SERVER: (ps_now, len(with_room) > 1 and not alike),
    }
    return ClusterGuidance(
        cluster_id=cluster.pk,
        name=cluster.name,
        fits=[
            StrategyFit(
                strategy=value,
                label=str(label),
                hint=STRATEGY_HINTS[value],
                now=fits[value][0],
                suggested=fits[value][1],
            )
            for value, label in Strategy.choices
        ],
    )
