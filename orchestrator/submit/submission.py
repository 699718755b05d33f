"""Submitting jobs: validation a user can act on, content-addressed scripts, plans, and the hand-off to scheduling.

Views, the REST API and the management command all come through here.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from contracts import environments, job_env
from contracts.programs import BUILTIN_PROGRAMS
from contracts.run_config import ConfigError, parse_config, parse_script_config
from orchestrator import limits
from orchestrator.core import placement, tf_config
from orchestrator.core import preflight as preflight_rules
from orchestrator.core.hosts import machine_of
from orchestrator.core.shapes import validate_shape
from orchestrator.environments import availability
from orchestrator.models import TERMINAL_JOB_STATES, Cluster, Host, Job, ProgramKind, Script, Strategy
from orchestrator.models.environments import default_environment
from orchestrator.models.validators import parse_labels
from orchestrator.plumbing import pass_requests as passes
from orchestrator.preflight import runs as preflight_runs
from orchestrator.scheduler import fleet_state, job_plans, queueing
from orchestrator.submit import job_fields

MAX_ARGS_CHARS = 4000


CONFIG = "builtin_config"


def config_field(key: str | None) -> str:
    """The field a problem with one key of the run's config is reported on: `builtin_config.<key>` (the form shows
    it next to that key's own input, the CLI next to its option), or `builtin_config` for the config as a whole."""
    return f"{CONFIG}.{key}" if key else CONFIG


class JobInvalid(Exception):
    """Every problem found, as (field, message) pairs: a job field's name, `builtin_config.<key>` for a key of the
    run's config, or `non_field_errors`. `errors` groups them field -> messages, the shape forms and serializers
    report."""

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.pairs = list(pairs)
        super().__init__(self.pairs)

    @property
    def errors(self) -> dict[str, list[str]]:
        grouped: dict[str, list[str]] = {}
        for field, message in self.pairs:
            grouped.setdefault(field, []).append(message)
        return grouped


@dataclass(frozen=True)
class Upload:
    filename: str
    content: bytes


def parse_args(value: str | list[str] | None) -> list[str]:
    """Arguments as a list: a JSON-style list is taken as is, a string is split like a shell would (never run)."""
    if value is None or value == "":
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    if len(value) > MAX_ARGS_CHARS:
        raise JobInvalid([("args", f"Arguments are limited to {MAX_ARGS_CHARS} characters.")])
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise JobInvalid([("args", f"Cannot split the arguments: {exc}.")]) from None


def new_job(owner: Any, cluster: Cluster, data: Mapping[str, Any], file: Any = None) -> tuple[Job, Upload | None]:
    """An unsaved job (and its upload) from cleaned form or serializer data; raises JobInvalid for bad `args`."""
    # One byte past the limit is enough to refuse it (check_script), whatever the file's size.
    upload = None
    if file is not None:
        upload = Upload(filename=file.name, content=file.read(settings.TFDASH_MAX_SCRIPT_BYTES + 1))
    builtin = data.get("builtin") or ""
    job = Job(
        owner=owner,
        cluster=cluster,
        program_kind=ProgramKind.BUILTIN if builtin and upload is None else ProgramKind.SCRIPT,
        builtin=builtin,
        builtin_config=data.get("builtin_config") or {},
        args=parse_args(data.get("args")),
        env=data.get("env") or {},
        **{field: data[field] for field in job_fields.SHAPE_FIELDS if data.get(field) is not None},
    )
    job.asked_priority = data.get("priority") or ""  # type: ignore[attr-defined] # resolved by validate()
    # True, False or None (the default rule): the form, the API and the CLI always say; a caller that does not (the
    # benches, the soak) asks for none, and its queue stays as it was.
    job.asked_preflight = data.get("preflight", False)  # type: ignore[attr-defined] # submit() decides
    if data.get("time_limit_s") is None:
        job.time_limit_s = 0  # the cluster's default, set by validate()
    return job, upload


def check_script(upload: Upload) -> list[str]:
    if not upload.filename.endswith(".py"):
        return [f"{upload.filename} is not a Python file (.py)."]
    too_large = limits.script_size_problem(len(upload.content))
    if too_large:
        return [too_large]
    try:
        source = upload.content.decode("utf-8")
    except UnicodeDecodeError:
        return ["The script is not UTF-8 text."]
    try:
        compile(source, upload.filename, "exec")
    except SyntaxError as exc:
        where = f" line {exc.lineno}" if exc.lineno is not None else ""  # a NUL byte has no line
        return [f"Syntax error in {upload.filename}{where}: {exc.msg}."]
    except ValueError as exc:  # Python 3.11 refuses a NUL byte with ValueError (3.12: SyntaxError, caught above)
        return [f"Syntax error in {upload.filename}: {exc}."]
    except (MemoryError, RecursionError):
        # e.g. `x=` followed by 200,000 minus signs: a valid-looking expression nested too deep for the parser.
        return [f"{upload.filename} is nested too deeply to compile."]
    return []


def store_script(upload: Upload) -> Script:
    sha = hashlib.sha256(upload.content).hexdigest()
    script, _ = Script.objects.get_or_create(
        sha256=sha,
        defaults={"content": upload.content, "size": len(upload.content), "filename": upload.filename[:255]},
    )
    return script


def validate(job: Job, upload: Upload | None, *, require_program: bool = True) -> None:
    """Raise JobInvalid with every problem found; a job that passes can run on its cluster once capacity frees.

    A plan may leave the program out (`require_program=False`): it is about shape and placement.
    """
    errors: list[tuple[str, str]] = []

    def add(field: str, message: str) -> None:
        errors.append((field, message))

    if job.strategy not in Strategy.values:
        add("strategy", f"Choose one of: {', '.join(Strategy.values)}.")
    if job.program_kind == ProgramKind.SCRIPT:
        if upload is None and job.script_id is None and require_program:
            add("script", "Upload the training script (.py) to run, or choose a built-in program.")
        elif upload is not None:
            for message in check_script(upload):
                add("script", message)
        if job.builtin_config:  # its hyperparameters, which reach it as TFDASH_* variables
            try:
                parse_script_config(job.builtin_config)
            except ConfigError as exc:
                add(config_field(exc.field), f"{exc}.")
    elif job.program_kind == ProgramKind.BUILTIN:
        if job.builtin not in BUILTIN_PROGRAMS:
            available = ", ".join(sorted(BUILTIN_PROGRAMS)) or "none yet"
            add("builtin", f"Unknown built-in program {job.builtin!r}; available: {available}.")
        else:
            # The runtime's own rules (plain Python): refused here rather than as a failed task later.
            try:
                config = parse_config(job.builtin, job.builtin_config)
            except ConfigError as exc:
                add(config_field(exc.field), f"{exc}.")
            else:
                if problem := ps_checkpoint_problem(job, config.checkpoint):
                    add(config_field("checkpoint"), problem)
    else:
        add("program_kind", "Choose an uploaded script or a built-in program.")
    for problem in job_env.problems(job.env):
        add("env", f"{problem}.")
    for field, message in queueing.settle(job):
        add(field, message)
    if job.labels:
        try:
            job.labels = ", ".join(parse_labels(job.labels))
        except Exception as exc:  # django ValidationError: report its text on the field
            add("labels", " ".join(getattr(exc, "messages", [str(exc)])))
    for field, message in environment_problems(job):
        add(field, message)
    if errors:
        raise JobInvalid(errors)

    shape = job_plans.job_shape(job)
    shape_errors = validate_shape(shape)
    if shape_errors:
        errors += shape_errors
        raise JobInvalid(errors)
    ever = job_plans.plan_on_empty_cluster(job)
    if isinstance(ever, placement.Unplaceable):
        add("non_field_errors", f"This job can never run on cluster {job.cluster.name}: {ever.reason}.")
        raise JobInvalid(errors)


def ps_checkpoint_problem(job: Job, checkpoints: bool) -> str:
    """Why a built-in ParameterServer job cannot keep checkpoints on its cluster, or "". TensorFlow has every ps task
    write its own variables at the chief's checkpoint path, on the ps's own disk (TF_NOTES.md, measured): on hosts
    that share no folder the first backup fails with NOT_FOUND on a ps. Refused here, where the user can act on it,
    rather than as a failed chief one epoch in. Hosts on one machine share its disk, so the local cluster is
    unaffected."""
    if job.strategy != Strategy.PARAMETER_SERVER or not checkpoints or job.cluster.shared_dir:
        return ""
    addresses = Host.objects.filter(cluster_id=job.cluster_id).values_list("address", flat=True)
    if len({machine_of(address) for address in addresses}) <= 1:
        return ""  # one machine (the local cluster's loopback hosts): its tasks see the same disk
    return (
        f"A ParameterServer job's checkpoints are written by every ps task at the chief's path, so they need a folder "
        f"every host sees, and cluster {job.cluster.name} has no shared folder: turn checkpoints off (checkpoint: "
        f"false), or ask staff to give the cluster one."
    )


def environment_problems(job: Job) -> list[tuple[str, str]]:
    """The job's task environment settled (blank: the cluster's default) and checked: one the cluster has not
    registered, or that no host of it can run, is refused with the reason (a host that can but is busy or offline
    only makes the job wait, and its page says so); its requirements file checked likewise."""
    problems = [("requirements", f"{problem[0].upper()}{problem[1:]}.")
                for problem in environments.requirements_problems(job.requirements or "")]  # fmt: skip
    if not job.environment:
        job.environment = default_environment(job.cluster_id)
    if not job.environment:
        return problems  # the agents' own interpreter: every host has it
    registered = fleet_state.registered_environments(job.cluster_id)
    interpreter = registered.get(job.environment)
    if interpreter is None:
        known = ", ".join(sorted(registered)) or "none (ask staff to register one)"
        problems.append(("environment", f"Cluster {job.cluster.name} has no environment named {job.environment}; "
                                        f"its environments: {known}."))  # fmt: skip
        return problems
    hosts = Host.objects.filter(cluster_id=job.cluster_id).values_list("name", "environments", "gpus")
    why = availability.hosts_problem(
        job.environment, interpreter, ((name, envs, bool(gpus)) for name, envs, gpus in hosts), job.cluster.name
    )
    if why:
        problems.append(("environment", f"{why[0].upper()}{why[1:]}."))
    return problems


def default_cluster() -> Cluster | None:
    return Cluster.objects.order_by("pk").first()


def submit(job: Job, upload: Upload | None) -> Job:
    """Validate, store the script, save the job as `queued` and ask the scheduler to look at its cluster. Refused
    (JobInvalid, nothing saved) when its owner already has as many jobs not yet ended as allowed."""
    validate(job, upload)
    wants_preflight = preflight_wanted(job)
    with transaction.atomic():
        _check_active_jobs(job.owner_id)
        if upload is not None:
            job.script = store_script(upload)
        job.save()
        if wants_preflight:
            preflight_runs.start(job)  # part of this submission: not counted against the owner's active jobs
        passes.schedule_after_commit(job.cluster_id)
    return job


def preflight_wanted(job: Job) -> bool:
    """Whether the (validated, unsaved) job gets a preflight: what its submitter asked (`asked_preflight`, from the
    form, the API or the CLI; a job made otherwise, an experiment's run, or without the key, gets none), else (None)
    the default rule (orchestrator/core/preflight.py), asked against the devices free now."""
    asked = getattr(job, "asked_preflight", False)
    if asked is not None:
        return bool(asked)
    if job.workers < preflight_rules.DEFAULT_MIN_WORKERS:
        return False  # (no plan needed)
    gang_fits_now = isinstance(job_plans.plan(job), placement.Placement)
    single_fits_now = not gang_fits_now and isinstance(job_plans.plan(preflight_runs.build(job)), placement.Placement)
    return preflight_rules.wanted(None, job.workers, gang_fits_now, single_fits_now)


def lock_owner_and_count_active(owner_id: int) -> int:
    """The owner's jobs not yet ended, counted with the owner's row locked (inside a transaction), so two
    submissions racing cannot both take the last place. FOR NO KEY UPDATE, not FOR UPDATE: it still serializes two
    submissions of one owner, but does not block another transaction's check of a foreign key to the user (a row
    that names its owner, checked at COMMIT): a scheduler pass that updates a job row twice re-checks all of the job's
    keys, the owner's included, while this submission's own check of the job's cluster waits for that pass's cluster
    lock, a deadlock (tests/orchestrator/submit/test_submission_locks.py)."""
    get_user_model().objects.select_for_update(no_key=True).filter(pk=owner_id).values_list("pk").first()
    return Job.objects.filter(owner_id=owner_id).exclude(state__in=TERMINAL_JOB_STATES).count()


def _check_active_jobs(owner_id: int) -> None:
    """The per-user limit on queued and running jobs, staff included (limits.active_jobs_problem)."""
    problem = limits.active_jobs_problem(lock_owner_and_count_active(owner_id))
    if problem:
        raise JobInvalid([("non_field_errors", problem)])


def describe_plan(job: Job) -> dict[str, Any]:
    """The placement and every task's TF_CONFIG the job would get, computed against the cluster as it is now, or
    against the idle cluster when it does not fit now (then `fits_now` is false and `reason` says why)."""
    now = job_plans.plan(job)
    fits_now = isinstance(now, placement.Placement)
    where = now if fits_now else job_plans.plan_on_empty_cluster(job)
    if isinstance(where, placement.Unplaceable):
        return {"fits_now": False, "reason": where.reason, "tasks": []}
    configs = job_plans.tf_configs(job, where)
    return {
        "fits_now": fits_now,
        "reason": "" if fits_now else now.reason,  # type: ignore[union-attr]
        "tasks": [
            {
                "type": t.type,
                "index": t.index,
                "host": t.host,
                "address": t.address,
                "port": tf_config.task_port(t, job.strategy),
                "devices": list(t.devices),
                "tf_config": configs[(t.type, t.index)],
            }
            for t in where.tasks
        ],
    }
