"""The builtin programs' configuration (`--config-json`): defaults, and validation with one-line reasons.

No TensorFlow here: a bad config is refused (exit code 2) before the 5 s TensorFlow import.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

from contracts.batching import SCALE_RULES
from contracts.programs import BUILTIN_PROGRAMS

OPTIMIZERS = ("adam", "sgd")

MAX_EPOCHS = 100_000
MAX_BATCH = 1 << 20
# The builtin programs hold out this share of their examples (seeded) for validation; the rest is trained on.
VAL_FRACTION = 0.2
DIGITS_EXAMPLES = 1797  # scikit-learn's digits, shipped with it

# Program-specific keys: which programs accept them. Everything else is common to all programs.
PROGRAM_KEYS: dict[str, tuple[str, ...]] = {
    "examples": ("synthetic",),
    "features": ("synthetic",),
    "classes": ("synthetic",),
    "hidden": ("digits_mlp", "synthetic", "npz"),
    "data_path": ("npz",),
}
DEFAULT_HIDDEN = (256, 256)


class ConfigError(ValueError):
    """A config the runtime refuses; the message is one line meant for the user, `field` the config key it is about
    (None: the config as a whole, e.g. not JSON or an unknown key)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Bound:
    """A number's range; `low_open`: it must be greater than `low`, not equal to it."""

    low: float
    high: float
    low_open: bool = False


# Every numeric key's bounds, once: the checks below, the job form, the REST API and the CLI read them here
# (orchestrator/submit/job_fields.py).
BOUNDS: dict[str, Bound] = {
    "per_replica_batch": Bound(1, MAX_BATCH),
    "epochs": Bound(1, MAX_EPOCHS),
    "learning_rate": Bound(0.0, 10.0, low_open=True),
    "warmup_epochs": Bound(0.0, float(MAX_EPOCHS)),
    "momentum": Bound(0.0, 0.999),
    "seed": Bound(0, 2**31 - 1),
    "steps_per_epoch": Bound(1, 10_000_000),
    "examples": Bound(16, 10_000_000),
    "features": Bound(1, 100_000),
    "classes": Bound(2, 100_000),
}
MAX_HIDDEN_LAYERS = 16
MAX_LAYER_WIDTH = 65_536
MAX_PATH_CHARS = 1000


@dataclass(frozen=True)
class RunConfig:
    program: str
    per_replica_batch: int = 32
    epochs: int = 5
    learning_rate: float = 0.001  # Adam's usual rate; the base before linear scaling
    scale_lr: str = "linear"
    warmup_epochs: float = 0.0
    optimizer: str = "adam"
    momentum: float = 0.9  # SGD only
    seed: int = 1234
    steps_per_epoch: int | None = None  # default: one pass over the training data in global batches
    checkpoint: bool = True
    # program-specific
    hidden: tuple[int, ...] = DEFAULT_HIDDEN
    examples: int = 8192
    features: int = 64
    classes: int = 10
    data_path: str = ""

    def as_facts(self) -> dict[str, Any]:
        data = asdict(self)
        data["hidden"] = list(self.hidden)
        for key, programs in PROGRAM_KEYS.items():
            if self.program not in programs:
                data.pop(key)
        return data


_COMMON_KEYS = tuple(f.name for f in fields(RunConfig) if f.name not in PROGRAM_KEYS and f.name != "program")


def allowed_keys(program: str) -> list[str]:
    return sorted([*_COMMON_KEYS, *(key for key, programs in PROGRAM_KEYS.items() if program in programs)])


def train_examples(config: RunConfig) -> int | None:
    """How many examples a builtin program trains on (what one epoch passes over); None for a file not yet read."""
    if config.program in ("digits_mlp", "digits_cnn"):
        total = DIGITS_EXAMPLES
    elif config.program == "synthetic":
        total = config.examples
    else:
        return None
    return total - round(total * VAL_FRACTION)


# A script of your own gets the same hyperparameters as these environment variables (the New job form offers the
# same fields for it): what it does with them is up to the script. Listed in docs/user-guide/job-environment.md.
SCRIPT_ENV: dict[str, str] = {
    "epochs": "TFDASH_EPOCHS",
    "per_replica_batch": "TFDASH_PER_REPLICA_BATCH",
    "learning_rate": "TFDASH_LEARNING_RATE",
    "scale_lr": "TFDASH_SCALE_LR",
    "warmup_epochs": "TFDASH_WARMUP_EPOCHS",
    "optimizer": "TFDASH_OPTIMIZER",
}


def parse_script_config(raw: str | dict[str, Any] | None) -> dict[str, Any]:
    """A script job's hyperparameters (SCRIPT_ENV's keys), checked as the builtins' are; ConfigError otherwise."""
    values = _load(raw)
    unknown = sorted(set(values) - set(SCRIPT_ENV))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(map(repr, unknown))} for a script; known: {', '.join(SCRIPT_ENV)}"
        )
    return {key: _CHECKS[key](key, value) for key, value in values.items()}


def script_env(config: dict[str, Any]) -> dict[str, str]:
    """The variables a script's processes get for its (checked) hyperparameters."""
    return {SCRIPT_ENV[key]: _env_text(value) for key, value in config.items() if key in SCRIPT_ENV}


def _env_text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def parse_config(program: str, raw: str | dict[str, Any] | None) -> RunConfig:
    """Validate `raw` (JSON text or a dict) for `program`; raise ConfigError with a one-line reason."""
    if program not in BUILTIN_PROGRAMS:
        raise ConfigError(f"unknown program {program!r}; builtin programs: {', '.join(sorted(BUILTIN_PROGRAMS))}")
    values = _load(raw)
    known = allowed_keys(program)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(map(repr, unknown))} for {program}; known: {', '.join(known)}"
        )
    checked: dict[str, Any] = {}
    for key, value in values.items():
        checked[key] = _CHECKS[key](key, value)
    config = RunConfig(program=program, **checked)
    if program == "npz":
        if not config.data_path:
            raise ConfigError(
                "npz needs data_path: a .npz file with x_train, y_train (optional x_val, y_val)", "data_path"
            )
        if not os.path.isfile(config.data_path):
            raise ConfigError(f"data_path {config.data_path!r} is not a readable file", "data_path")
    return config


def _load(raw: str | dict[str, Any] | None) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config must be a JSON object, not {type(raw).__name__}")
    return raw


# --- value checks -----------------------------------------------------------------------------------------------
def number_text(value: float) -> str:
    """A bound as people write it: 100000, not 100000.0 or 1e+05; 0.999 as it is."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _int(key: str, value: Any, low: float, high: float) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} must be an integer, not {value!r}", key)
    if not low <= value <= high:
        raise ConfigError(f"{key} must be between {number_text(low)} and {number_text(high)}, not {value}", key)
    return value


def _float(key: str, value: Any, bound: Bound) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, not {value!r}", key)
    if value < bound.low or value > bound.high or (bound.low_open and value == bound.low):
        low = f"greater than {number_text(bound.low)}" if bound.low_open else f"at least {number_text(bound.low)}"
        raise ConfigError(f"{key} must be {low} and at most {number_text(bound.high)}, not {value}", key)
    return float(value)


def _bounded_int(key: str, value: Any) -> int:
    return _int(key, value, BOUNDS[key].low, BOUNDS[key].high)


def _bounded_float(key: str, value: Any) -> float:
    return _float(key, value, BOUNDS[key])


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(choices)}, not {value!r}", key)
    return str(value)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, not {value!r}", key)
    return value


def _hidden(key: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_HIDDEN_LAYERS:
        raise ConfigError(f"{key} must be a list of 1 to {MAX_HIDDEN_LAYERS} layer widths, not {value!r}", key)
    widths = []
    for i, width in enumerate(value):
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_LAYER_WIDTH:
            raise ConfigError(f"{key}[{i}] must be an integer between 1 and {MAX_LAYER_WIDTH}, not {width!r}", key)
        widths.append(width)
    return tuple(widths)


def _path(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key} must be a non-empty path, not {value!r}", key)
    if len(value) > MAX_PATH_CHARS:
        raise ConfigError(f"{key} is limited to {MAX_PATH_CHARS} characters, not {len(value)}", key)
    return os.path.abspath(os.path.expanduser(value))


def _steps(key: str, value: Any) -> int | None:
    return None if value is None else _bounded_int(key, value)


_CHECKS = {
    "per_replica_batch": _bounded_int,
    "epochs": _bounded_int,
    "learning_rate": _bounded_float,
    "scale_lr": lambda k, v: _choice(k, v, SCALE_RULES),
    "warmup_epochs": _bounded_float,
    "optimizer": lambda k, v: _choice(k, v, OPTIMIZERS),
    "momentum": _bounded_float,
    "seed": _bounded_int,
    "steps_per_epoch": _steps,
    "checkpoint": _bool,
    "hidden": _hidden,
    "examples": _bounded_int,
    "features": _bounded_int,
    "classes": _bounded_int,
    "data_path": _path,
}
