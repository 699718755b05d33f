"""A job's own environment variables (`Job.env`): which names a user may set, and the bounds on them.

One definition for every side: the form, the REST serializer and the `tfdash` CLI refuse a bad variable before the
job is stored (the CLI through the rules `scripts/gen_client_fields.py` copies into its package), and the agent checks
a launch order's variables again before it starts anything (an order is data; worker_agent/supervision/launch.py).

A reserved name is one the product sets itself, or one that changes how the task's processes start (the loader, the
interpreter, the devices placement chose): a job that needs another value for one of these has a field for it
(`legacy_keras`, the shape) or does not need it. docs/user-guide/job-environment.md lists them with these reasons.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_VARS = 64
MAX_NAME_CHARS = 128
MAX_VALUE_CHARS = 4096
NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
NAME = re.compile(rf"^{NAME_PATTERN}$")
NAME_RULE = f"letters, digits and underscores, not starting with a digit, at most {MAX_NAME_CHARS} characters"

# name -> why it is not the job's to set. Compared without regard to case: `tf_config` is refused too (a name that
# differs from a reserved one only by case is a mistake, never what the person meant).
RESERVED: dict[str, str] = {
    "TF_CONFIG": "tfdash writes each task's cluster and role",
    "GRPC_FAIL_FAST": "tfdash sets it for ParameterServer jobs",
    "TF_USE_LEGACY_KERAS": "set by the job's legacy_keras field",
    "CUDA_VISIBLE_DEVICES": "the devices placement gave the task",
    "NVIDIA_VISIBLE_DEVICES": "the devices placement gave the task",
    "ROCR_VISIBLE_DEVICES": "the devices placement gave the task",
    "HIP_VISIBLE_DEVICES": "the devices placement gave the task",
    "LD_PRELOAD": "would load native code into every process of the task, tfdash's runtime included",
    "LD_LIBRARY_PATH": "would change which native libraries TensorFlow and Python load",
    "LD_AUDIT": "would load native code into every process of the task",
    "PYTHONPATH": "tfdash puts its metrics hook and runtime on it",
    "PYTHONHOME": "would point the interpreter away from the environment tasks run in",
    "PYTHONSTARTUP": "belongs to interactive interpreters",
    "PYTHONINSPECT": "would leave a finished task waiting for input instead of exiting",
    "PYTHONUSERBASE": "would change which packages the interpreter finds",
    "PYTHONNOUSERSITE": "would change which packages the interpreter finds",
    "PYTHONPLATLIBDIR": "would change which packages the interpreter finds",
    "PYTHONEXECUTABLE": "would change which interpreter Python reports",
    "PYTHONUNBUFFERED": "tfdash sets it so that log lines arrive as they are printed",
    "PATH": "the host's own; a script names a tool's full path instead",
    "HOME": "the job's folder when tasks run under their own user",
    "USER": "the user the task runs as",
    "LOGNAME": "the user the task runs as",
}
RESERVED_PREFIXES: dict[str, str] = {"TFDASH_": "tfdash's own variables (job, task, metrics pipe, hyperparameters)"}


def name_problem(name: object) -> str:
    """Why `name` cannot be one of a job's variables, or "" when it can. The message names the variable."""
    if not isinstance(name, str) or not NAME.match(name) or len(name) > MAX_NAME_CHARS:
        return f"{str(name)[:MAX_NAME_CHARS]!r} is not a variable name: {NAME_RULE}"
    upper = name.upper()
    if upper in RESERVED:
        return f"{name} is reserved: {RESERVED[upper]}"
    for prefix, why in RESERVED_PREFIXES.items():
        if upper.startswith(prefix):
            return f"{name} is reserved: names starting with {prefix} are {why}"
    return ""


def value_problem(name: str, value: object) -> str:
    if not isinstance(value, str):
        return f"{name}'s value must be a string, not {type(value).__name__}"
    if len(value) > MAX_VALUE_CHARS:
        return f"{name}'s value is limited to {MAX_VALUE_CHARS} characters, not {len(value)}"
    if "\x00" in value:
        return f"{name}'s value holds a NUL character, which no environment can carry"
    return ""


def problems(env: object) -> list[str]:
    """Every reason `env` (name -> value) cannot be a job's environment; empty when it can."""
    if not isinstance(env, dict):
        return [f"the environment is an object of names to string values, not {type(env).__name__}"]
    if len(env) > MAX_VARS:
        return [f"a job may set at most {MAX_VARS} variables, not {len(env)}"]
    found = []
    for name, value in env.items():
        problem = name_problem(name) or value_problem(name, value)
        if problem:
            found.append(problem)
    return found


def parse_assignments(items: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """`NAME=value` items (the form's lines, the CLI's `--env`) as a dict, and what is wrong with them. Blank items
    are skipped; the value is everything after the first `=`, kept as typed (spaces included)."""
    env: dict[str, str] = {}
    found: list[str] = []
    for item in items:
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            found.append(f"{item[:MAX_NAME_CHARS]!r} is not NAME=value")
        elif name in env:
            found.append(f"{name} is set twice")
        else:
            env[name] = value
    return env, found + problems(env)
