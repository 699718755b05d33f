"""A job's fields as people set them: name, label, bounds and default, once. The browser form
(dashboard/forms.py), the REST serializer (orchestrator/api/job_serializers.py) and the `submit` command are built
from this table, so they cannot disagree; `submission.validate` then checks what no single field can (the shape
against the strategy, placement on the cluster).

Counts are bounded by contracts/limits.py, the numbers placement enforces. Their lower bound is 0, not 1, so that a
zero reaches validation and gets the strategy's own message ("parameter_server needs at least 1 ps").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.batching import SCALE_RULES
from contracts.environments import MAX_REQUIREMENTS_BYTES
from contracts.limits import MAX_DEVICES_PER_WORKER, MAX_PS, MAX_WORKERS
from contracts.run_config import BOUNDS, DEFAULT_HIDDEN, MAX_PATH_CHARS, OPTIMIZERS, PROGRAM_KEYS, RunConfig
from contracts.strategies import STRATEGY_LABELS, Strategy
from orchestrator.core import preflight
from orchestrator.core.restarts import EXIT_CODE, POLICIES

MAX_NAME_CHARS = 200
# A run shorter than a minute cannot be planned around (passes, start-up); a year is no limit a scheduler can use.
MIN_TIME_LIMIT_S = 60
MAX_TIME_LIMIT_S = 365 * 86_400
MAX_LABELS_CHARS = 500


@dataclass(frozen=True)
class JobField:
    name: str
    kind: type  # int, float, str or bool; a str field with `choices` is a choice
    label: str
    default: Any
    help: str = ""
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False  # the value must be greater than `min`
    max_length: int | None = None
    choices: tuple[tuple[str, str], ...] = ()
    required: bool = False  # no default applies: the person must give it
    # The browser form may leave it out (older pages, scripted posts) and the default applies.
    optional_in_form: bool = False


FIELDS: tuple[JobField, ...] = (
    JobField("name", str, "Name", None, max_length=MAX_NAME_CHARS, required=True),
    JobField(
        "strategy",
        str,
        "Strategy",
        Strategy.MULTI_WORKER_MIRRORED.value,
        choices=tuple((s.value, STRATEGY_LABELS[s]) for s in Strategy),
    ),
    JobField("workers", int, "Workers", 1, min=0, max=MAX_WORKERS),
    JobField("ps", int, "Parameter servers", 0, min=0, max=MAX_PS),
    JobField("devices_per_worker", int, "Devices per worker", 1, min=0, max=MAX_DEVICES_PER_WORKER),
    JobField(
        "labels",
        str,
        "Labels",
        "",
        help="place only on hosts with all these labels",
        max_length=MAX_LABELS_CHARS,
        optional_in_form=True,
    ),
    JobField(
        "environment",
        str,
        "Task environment",
        "",
        help="the Python with TensorFlow its tasks run in, by the name staff registered on the cluster (each host's "
        "page shows what it has); blank: the cluster's default",
        max_length=63,
        optional_in_form=True,
    ),
    JobField(
        "requirements",
        str,
        "Requirements",
        "",
        help="pip requirement lines (e.g. scikit-learn==1.5.2) installed into a venv on top of the environment, built "
        "once per content on each host; no options, paths or URLs",
        max_length=MAX_REQUIREMENTS_BYTES,
        optional_in_form=True,
    ),
    JobField("max_restarts", int, "Max restarts", 0, min=0, max=100),
    JobField(
        "restart_policy",
        str,
        "Restart policy",
        EXIT_CODE,
        help="which failures use a restart; a restart resumes from the job's last checkpoint",
        choices=POLICIES,
        optional_in_form=True,
    ),
    JobField(
        "progress_timeout_s",
        int,
        "Hang timeout (s)",
        600,
        help="a running job with no new metric point or log line for this long is restarted or failed (0: off)",
        min=0,
        max=86_400,
        optional_in_form=True,
    ),
    JobField(
        "legacy_keras",
        bool,
        "tf.keras is tf_keras (TF_USE_LEGACY_KERAS=1)",
        True,
        help="tf_keras's model.fit works with every strategy; Keras 3's fails under MultiWorkerMirrored and "
        "ParameterServer",
    ),
    JobField("startup_deadline_s", int, "Start-up deadline (s)", 120, min=10, max=3600),
    JobField(
        "time_limit_s",
        int,
        "Time limit (s)",
        None,
        help="each run is stopped after this long (SIGTERM, a grace, SIGKILL): state timed out; blank: the "
        "cluster's default. The scheduler plans with it: a short limit may start sooner (backfill)",
        min=MIN_TIME_LIMIT_S,
        max=MAX_TIME_LIMIT_S,
        optional_in_form=True,
    ),
    JobField(
        "priority",
        str,
        "Priority class",
        "",
        help="a class staff defined and let you use (each class's rule is on the queue page); blank: the default",
        max_length=32,
        optional_in_form=True,
    ),
    JobField(
        "preflight",
        bool,
        "Preflight",
        None,
        help=f"first run the script on one worker of one device for {preflight.STEPS} steps or "
        f"{preflight.TIME_LIMIT_S} s, on a free device, and refuse the job with its verdict if it fails; blank: on "
        f"for a gang of {preflight.DEFAULT_MIN_WORKERS} or more workers that must wait for its devices",
        optional_in_form=True,
    ),
)

BY_NAME = {f.name: f for f in FIELDS}
# Fields that are no Job column as given: the priority class is named, the row is found by submission.validate; the
# preflight is asked for (yes, no, or the default: submission.submit decides, orchestrator/preflight/ makes it).
NAMED_FIELDS = ("priority", "preflight")
# The Job columns these fields set as they are given.
SHAPE_FIELDS = tuple(f.name for f in FIELDS if f.name not in NAMED_FIELDS)


# A run's hyperparameters, as the New job form offers them. For a builtin program they become its config
# (`Job.builtin_config`, checked by contracts/run_config.py, whose BOUNDS these fields read); for a script, its
# TFDASH_* variables (run_config.SCRIPT_ENV). Left empty, the runtime's default applies.
_RUN = RunConfig(program="synthetic")


def _bounds(key: str) -> dict[str, Any]:
    bound = BOUNDS[key]
    return {"min": bound.low, "max": bound.high, "min_exclusive": bound.low_open}


_SCALING = {"linear": "linear (× replicas in sync)", "none": "none"}
HYPERPARAMETERS: tuple[JobField, ...] = (
    JobField("epochs", int, "Epochs", _RUN.epochs, **_bounds("epochs"), optional_in_form=True),
    JobField(
        "per_replica_batch",
        int,
        "Per-replica batch",
        _RUN.per_replica_batch,
        help="examples each replica (device) computes per step",
        **_bounds("per_replica_batch"),
        optional_in_form=True,
    ),
    JobField(
        "learning_rate",
        float,
        "Learning rate",
        _RUN.learning_rate,
        help="the base rate, before scaling",
        **_bounds("learning_rate"),
        optional_in_form=True,
    ),
    JobField(
        "scale_lr",
        str,
        "LR scaling",
        _RUN.scale_lr,
        help="linear: the rate times the replicas in sync, as the global batch grows (Goyal et al., 2017)",
        choices=tuple((rule, _SCALING[rule]) for rule in SCALE_RULES),
        optional_in_form=True,
    ),
    JobField(
        "warmup_epochs",
        float,
        "Warm-up epochs",
        _RUN.warmup_epochs,
        help="the rate rises from the base to the scaled rate over these epochs",
        **_bounds("warmup_epochs"),
        optional_in_form=True,
    ),
    JobField(
        "optimizer", str, "Optimizer", _RUN.optimizer, choices=tuple((o, o) for o in OPTIMIZERS), optional_in_form=True
    ),
)

# The builtin programs' own keys (run_config.PROGRAM_KEYS says which program takes which).
PROGRAM_FIELDS: tuple[JobField, ...] = (
    JobField(
        "hidden",
        str,
        "Hidden layers",
        ", ".join(map(str, DEFAULT_HIDDEN)),
        help="layer widths, comma-separated",
        max_length=200,
        optional_in_form=True,
    ),
    JobField(
        "data_path",
        str,
        "Data file (.npz path)",
        "",
        help="a path every host can read: x_train, y_train (optional x_val, y_val)",
        max_length=MAX_PATH_CHARS,
        optional_in_form=True,
    ),
    JobField("examples", int, "Examples", _RUN.examples, **_bounds("examples"), optional_in_form=True),
    JobField("features", int, "Features", _RUN.features, **_bounds("features"), optional_in_form=True),
    JobField("classes", int, "Classes", _RUN.classes, **_bounds("classes"), optional_in_form=True),
)
assert {f.name for f in PROGRAM_FIELDS} == set(PROGRAM_KEYS)
