from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from django import forms

from contracts import job_env
from contracts.programs import BUILTIN_PROGRAMS
from contracts.run_config import PROGRAM_KEYS
from contracts.strategies import STRATEGY_HINTS
from orchestrator.experiments import actions as experiments
from orchestrator.models import Cluster, ExperimentMode, Job, ProgramKind, Script, Strategy
from orchestrator.scheduler import class_rights, fleet_state
from orchestrator.submit import job_fields, submission
from orchestrator.submit.job_fields import JobField

SCRIPT = "script"  # the Program choice for a script of the user's own; the others are the builtin programs
PROGRAM_CHOICES = [*((name, name) for name in BUILTIN_PROGRAMS), (SCRIPT, "My script")]


def _form_field(spec: JobField) -> forms.Field:
    """The form's input for one of the job's fields (orchestrator/submit/job_fields.py)."""
    common: dict[str, Any] = {"label": spec.label, "help_text": spec.help, "initial": spec.default}
    if spec.kind is bool:
        return forms.BooleanField(required=False, **common)
    if spec.choices:
        if spec.optional_in_form:
            return forms.TypedChoiceField(choices=spec.choices, required=False, empty_value=None, **common)
        return forms.ChoiceField(choices=spec.choices, **common)
    if spec.kind is int:
        return forms.IntegerField(min_value=spec.min, max_value=spec.max, required=not spec.optional_in_form, **common)
    if spec.kind is float:
        field = forms.FloatField(min_value=spec.min, max_value=spec.max, required=False, **common)
        field.widget.attrs["step"] = "any"  # a rate like 0.0005 is no multiple of a step
        if spec.min_exclusive:
            field.validators.append(_greater_than(spec.min))
        return field
    return forms.CharField(max_length=spec.max_length, required=spec.required, **common)


def _greater_than(low: float | None) -> Any:
    def check(value: float) -> None:
        if value is not None and low is not None and value <= low:
            raise forms.ValidationError(f"Ensure this value is greater than {low:g}.")

    return check


def env_text(env: dict[str, str]) -> str:
    """A job's variables as the form's text: NAME=value, one a line."""
    return "\n".join(f"{name}={value}" for name, value in env.items())


class _JobForm(forms.Form):
    """The job form: the job's fields from their one definition (JobForm, below), plus what to run and its
    hyperparameters. What no single field can check (the shape against the strategy, the cluster, the program's
    config) is submission.validate's, whose messages land next to their field."""

    label_suffix = ""  # labels read exactly as job_fields names them ("Epochs", not "Epochs:")
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all(), empty_label=None)
    # Left out by older pages and scripted posts: then an uploaded script runs (or, run again, the source's program).
    program = forms.ChoiceField(
        label="Program", choices=PROGRAM_CHOICES, required=False, widget=forms.RadioSelect, initial="digits_mlp"
    )
    script = forms.FileField(required=False, label="Upload a script", help_text="a tf.distribute training script (.py)")
    earlier_script = forms.ChoiceField(label="Or one of my earlier scripts", required=False)
    args = forms.CharField(
        required=False,
        label="Arguments",
        max_length=submission.MAX_ARGS_CHARS,
        help_text="passed to the program, e.g. --out .",
    )
    env = forms.CharField(
        required=False,
        label="Environment variables",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        # Every line at its longest, with its name and "=": the bounds themselves are job_env's, checked in clean_env.
        max_length=job_env.MAX_VARS * (job_env.MAX_NAME_CHARS + job_env.MAX_VALUE_CHARS + 2),
        help_text="NAME=value, one a line; every task of the job gets them (e.g. DATA=/shared/digits.npz). Shown on "
        "the job's page: no secrets. Reserved: TF_CONFIG, TFDASH_*, PYTHONPATH, LD_PRELOAD, CUDA_VISIBLE_DEVICES, ...",
    )

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Only the person's own earlier scripts (scripts are stored once per content, shared by every job that ran
        # one): the jobs they own say which, so nobody sees another's script by name or hash.
        scripts = Script.objects.none() if user is None else Script.objects.filter(jobs__owner=user)
        self.earlier_scripts = {s.sha256: s for s in scripts.distinct().order_by("-created_at")[:50]}
        choices = [("", "—")] + [(sha, f"{s.filename} ({sha[:12]})") for sha, s in self.earlier_scripts.items()]
        self.fields["earlier_script"].choices = choices  # type: ignore[attr-defined]
        if user is not None and "priority" in self.fields:
            # Which classes are theirs, before they submit (the queue page has every class's rule).
            mine = ", ".join(class_rights.usable_names(user))
            self.fields["priority"].help_text = f"{self.fields['priority'].help_text}. Yours: {mine}"
        for name, field in self.fields.items():
            if field.help_text:  # the hint is read with its input, by screen readers too
                field.widget.attrs["aria-describedby"] = f"hint-{name}"

    def clean_env(self) -> dict[str, str]:
        env, problems = job_env.parse_assignments((self.cleaned_data.get("env") or "").splitlines())
        if problems:
            raise forms.ValidationError([f"{problem}." for problem in problems])
        return env

    def clean_hidden(self) -> list[int] | None:
        text = (self.cleaned_data.get("hidden") or "").strip()
        if not text:
            return None
        try:
            return [int(width) for width in text.replace(",", " ").split()]
        except ValueError:
            raise forms.ValidationError("Give layer widths as whole numbers, e.g. 256, 256.") from None

    def config(self) -> dict[str, Any]:
        """The run's config as given: every hyperparameter set, and the chosen builtin program's own keys."""
        data = self.cleaned_data
        program = data.get("program") or ""
        config = {f.name: data[f.name] for f in job_fields.HYPERPARAMETERS if data.get(f.name) is not None}
        for key, programs in PROGRAM_KEYS.items():
            if program in programs and data.get(key) not in (None, ""):
                config[key] = data[key]
        return config

    def chose_program(self) -> bool:
        return bool(self.cleaned_data.get("program"))

    def build(self, owner: object) -> tuple[Job, submission.Upload | None]:
        """The unsaved job and its upload; raises submission.JobInvalid (e.g. for arguments that cannot be split)."""
        data = dict(self.cleaned_data)
        program = data.get("program") or ""
        file = data.get("script")
        if program in BUILTIN_PROGRAMS:
            data["builtin"] = program
            file = None  # a file chosen before switching to a builtin program is not what runs
        if program:
            data["builtin_config"] = self.config()
        job, upload = submission.new_job(owner, data["cluster"], data, file)
        earlier = self.earlier_scripts.get(data.get("earlier_script") or "")
        if job.program_kind == ProgramKind.SCRIPT and upload is None and earlier is not None:
            job.script = earlier
        return job, upload

    def add_job_errors(self, pairs: list[tuple[str, str]]) -> None:
        """submission.JobInvalid's (field, message) pairs, each next to its input: a key of the run's config
        (`builtin_config.<key>`) on that key's own input, the builtin program on the Program choice."""
        for field, message in pairs:
            prefix, _, key = field.partition(".")
            name = key if prefix == submission.CONFIG and key else {"builtin": "program"}.get(field, field)
            self.add_error(name if name in self.fields else None, message)


CONFIG_FIELDS = {f.name for f in (*job_fields.HYPERPARAMETERS, *job_fields.PROGRAM_FIELDS)}
JobForm = type(
    "JobForm",
    (_JobForm,),
    {
        spec.name: _form_field(spec)
        for spec in (*job_fields.FIELDS, *job_fields.HYPERPARAMETERS, *job_fields.PROGRAM_FIELDS)
    },
)
# Long choices read better as radios than cut off in a narrow select.
JobForm.base_fields["restart_policy"].widget = forms.RadioSelect(choices=job_fields.BY_NAME["restart_policy"].choices)
JobForm.base_fields["requirements"].widget = forms.Textarea(attrs={"rows": 3, "spellcheck": "false"})
# The preflight is yes, no or the default rule (orchestrator/core/preflight.py): a checkbox cannot say the third.
JobForm.base_fields["preflight"] = forms.NullBooleanField(
    required=False,
    label=job_fields.BY_NAME["preflight"].label,
    help_text=job_fields.BY_NAME["preflight"].help,
    widget=forms.NullBooleanSelect(),
)
JobForm.base_fields["preflight"].widget.choices = [
    ("unknown", "default (on when its gang must wait)"),
    ("true", "always"),
    ("false", "never"),
]
# Sections in the order people decide; the template renders each section's fields in this order.
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What to train", ("name", "program", "script", "earlier_script", "args", *PROGRAM_KEYS, "env", "requirements")),
    ("Strategy and shape", ("cluster", "strategy", "workers", "ps", "devices_per_worker", "labels", "environment")),
    ("Scheduling", ("time_limit_s", "priority", "preflight")),
    ("Hyperparameters", tuple(f.name for f in job_fields.HYPERPARAMETERS)),
    (
        "Resilience",
        ("restart_policy", "max_restarts", "progress_timeout_s", "startup_deadline_s", "legacy_keras"),
    ),
)


def initial_from(job: Job) -> dict[str, Any]:
    """The form's fields as `job` had them, to run it again (with another strategy, say). A file field cannot be
    pre-filled: a script job names its stored script instead (the view falls back to it when none is chosen)."""
    config = dict(job.builtin_config or {})
    if isinstance(config.get("hidden"), list):
        config["hidden"] = ", ".join(map(str, config["hidden"]))
    return {
        **{name: getattr(job, name) for name in job_fields.SHAPE_FIELDS},
        "priority": job.priority,
        "name": f"{job.name} (again)"[: job_fields.MAX_NAME_CHARS],
        "cluster": job.cluster_id,
        "args": shlex.join(str(a) for a in job.args) if isinstance(job.args, list) else "",
        "env": env_text(job.env) if isinstance(job.env, dict) else "",
        "program": job.builtin if job.program_kind == ProgramKind.BUILTIN else SCRIPT,
        **({"earlier_script": job.script_id} if job.script_id else {}),
        **{key: value for key, value in config.items() if key in CONFIG_FIELDS},
    }


def default_shape(guidance: ClusterGuidance | None) -> dict[str, Any]:
    """A new form's strategy and shape: what suits the cluster now (else what can start on one machine), filled in
    so that the form opens valid. Mirrored is one machine; ParameterServer needs a ps."""
    strategy = Strategy.MIRRORED.value
    if guidance is not None:
        suggested = [fit.strategy for fit in guidance.fits if fit.suggested]
        if guidance.hosts_with_room >= 2:
            strategy = suggested[0] if suggested else Strategy.MULTI_WORKER_MIRRORED.value
    return shape_for(strategy, guidance)


def shape_for(strategy: str, guidance: ClusterGuidance | None) -> dict[str, Any]:
    """The shape a strategy starts with on this cluster (also what the page's script applies on a switch)."""
    hosts = guidance.hosts_with_room if guidance is not None else 1
    largest = guidance.largest_free if guidance is not None else 1
    if strategy == Strategy.MIRRORED:
        return {"strategy": strategy, "workers": 1, "ps": 0, "devices_per_worker": max(1, largest)}
    if strategy == Strategy.PARAMETER_SERVER:
        return {"strategy": strategy, "workers": max(1, min(hosts, 2)), "ps": 1, "devices_per_worker": 1}
    return {"strategy": strategy, "workers": 2, "ps": 0, "devices_per_worker": 1}


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
    hosts_with_room: int = 0
    largest_free: int = 0


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def cluster_guidance(cluster: Cluster) -> ClusterGuidance:
    """Which strategy the cluster suits now, from its online hosts and the device slots running tasks leave free."""
    online = [h for h in fleet_state.host_states(fleet_state.placement_hosts(cluster.pk)) if h.online]
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
        hosts_with_room=len(with_room),
        largest_free=largest[1],
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


# "Compare strategies" on the New job form: the variants offered, as "strategy:workers:ps:devices" (the seed's own
# comparison, and the 1-replica baseline scaling efficiency is measured against).
VARIANT_CHOICES: tuple[tuple[str, str], ...] = tuple(
    (f"{v.strategy}:{v.workers}:{v.ps}:{v.devices_per_worker}", v.label)
    for v in (
        experiments.Variant(Strategy.MIRRORED.value, 1, 0, 1),
        experiments.Variant(Strategy.MIRRORED.value, 1, 0, 2),
        experiments.Variant(Strategy.MULTI_WORKER_MIRRORED.value, 2, 0, 1),
        experiments.Variant(Strategy.PARAMETER_SERVER.value, 2, 1, 1),
    )
)
DEFAULT_VARIANTS = [value for value, _ in VARIANT_CHOICES[1:3]]


class ExperimentOptionsForm(forms.Form):
    """The part of the New job form that turns its program and hyperparameters into a compare-strategies experiment;
    the strategy and shape fields above are then ignored (each variant brings its own)."""

    label_suffix = ""
    variants = forms.MultipleChoiceField(
        label="Variants to compare",
        choices=VARIANT_CHOICES,
        widget=forms.CheckboxSelectMultiple,
        initial=DEFAULT_VARIANTS,
        help_text="two or more; the same program and hyperparameters run under each",
    )
    experiment_mode = forms.ChoiceField(
        label="Run them",
        choices=ExperimentMode.choices,
        initial=ExperimentMode.SEQUENTIAL,
        widget=forms.RadioSelect,
        help_text="side by side only where the cluster has room for every variant at once",
    )
    target_accuracy = forms.FloatField(
        label="Target accuracy",
        min_value=0.01,
        max_value=1.0,
        initial=0.9,
        help_text="the experiment compares the time each variant takes to reach it",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["target_accuracy"].widget.attrs["step"] = "any"
        for name, field in self.fields.items():
            field.widget.attrs["aria-describedby"] = f"hint-{name}"

    def chosen_variants(self) -> list[experiments.Variant]:
        chosen = []
        for value in self.cleaned_data["variants"]:
            strategy, workers, ps, devices = value.split(":")
            chosen.append(experiments.Variant(strategy, int(workers), int(ps), int(devices)))
        return chosen
