"""Checks before a task starts, and the environment it starts with: a spec that is malformed or unsafe, or a port
something else holds, is refused (reported, nothing started)."""

from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path
from typing import Any

from contracts import job_env
from contracts.task_messages import LaunchSpec, TaskEventKind
from worker_agent.supervision.runtime_root import PACKAGE_ROOT, runtime_pythonpath

HOOKS_DIR = Path(__file__).resolve().parent.parent / "hooks"  # the checkout's; tasks get runtime_root.py's copy
# What a task inherits from the agent's environment: what any process needs (paths, locale, temp, the Python the
# agent runs), and what TF and the accelerator stack read. Nothing else: the agent's environment may hold its token,
# the broker URL, a database URL. Even an allowed name is dropped when it names a secret (HF_TOKEN, ...).
INHERITED = frozenset({
    "PATH", "HOME", "LANG", "LANGUAGE", "TZ", "USER", "LOGNAME", "TMPDIR", "TEMP", "TMP", "PYTHONPATH",
    "PYTHONHASHSEED", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR",
})  # fmt: skip
INHERITED_PREFIXES = ("LC_", "TF_", "CUDA_", "NVIDIA_", "NCCL_", "XLA_", "OMP_", "MKL_", "KMP_", "OPENBLAS_")
SECRET_MARKERS = ("TOKEN", "PASSWORD", "SECRET", "KEY", "CREDENTIAL")
log = logging.getLogger(__name__)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")


class Refused(Exception):
    """A launch that must not (or could not) start: reported as `kind` with `detail`, nothing left running."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def child_env(spec: LaunchSpec, workdir: Path) -> dict[str, str]:
    """The allowed part of the agent's environment, plus the task's own variables and device selection."""
    env = {name: value for name, value in os.environ.items() if _inherited(name)}
    env.update(spec.user_env)  # checked by validate(): no reserved name, so nothing below is overridden by it
    env.update(spec.env)
    env.update(
        PYTHONUNBUFFERED="1",
        TFDASH_JOB_ID=str(spec.job_id),
        TFDASH_TASK_ID=str(spec.task_id),
        TFDASH_TASK_TYPE=spec.task_type,
        TFDASH_TASK_INDEX=str(spec.task_index),
        TFDASH_ATTEMPT=str(spec.attempt),
    )
    if spec.gpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.devices))
        env.pop("TFDASH_LOGICAL_CPU_DEVICES", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""  # hide any GPU: a CPU task must not grab one
        env["TFDASH_LOGICAL_CPU_DEVICES"] = str(len(spec.devices))
    env["PYTHONPATH"] = task_pythonpath(env.get("PYTHONPATH", ""), workdir)
    return env


def inherited_env(workdir: Path) -> dict[str, str]:
    """The allowed part of the agent's environment, with the runtime on the path (what a task's Python needs)."""
    env = {name: value for name, value in os.environ.items() if _inherited(name)}
    env["PYTHONPATH"] = task_pythonpath(env.get("PYTHONPATH", ""), workdir)
    return env


def task_pythonpath(existing: str, workdir: Path) -> str:
    """The runtime set's copy (runtime_root.py: its hooks first, so their sitecustomize runs and chains to any other;
    then its root, so `-m worker_agent.runtime` and `from worker_agent import report` find it from any cwd), then
    what the agent's own PYTHONPATH names, less the agent's checkout. A user's script folder comes before all of it
    (sys.path[0]), so none of it shadows the user's own modules."""
    ours = {os.path.realpath(PACKAGE_ROOT), os.path.realpath(HOOKS_DIR)}
    paths = [p for p in existing.split(os.pathsep) if p and os.path.realpath(p) not in ours]
    return os.pathsep.join([*runtime_pythonpath(workdir), *paths])


def _inherited(name: str) -> bool:
    upper = name.upper()
    allowed = upper in INHERITED or upper.startswith(INHERITED_PREFIXES)
    return allowed and not any(marker in upper for marker in SECRET_MARKERS)


def validate(spec: LaunchSpec) -> None:
    """launch_spec_from checks shape, not types; these values become paths, argv and env, so check them here."""
    problem = _spec_problem(spec)
    if problem:
        raise Refused(TaskEventKind.LAUNCH_FAILED, f"malformed launch spec: {problem}")


def _spec_problem(spec: LaunchSpec) -> str:
    for name in ("job_id", "task_id", "attempt", "task_index"):
        if not _is_count(getattr(spec, name)):
            return f"{name} must be a non-negative integer"
    if not isinstance(spec.task_type, str) or not _SAFE_NAME.match(spec.task_type):
        return "task_type must be letters, digits or underscores"
    if spec.port is not None and not (_is_count(spec.port) and 1 <= spec.port <= 65535):
        return "port must be null or 1..65535"
    if not isinstance(spec.devices, list) or not all(_is_count(d) for d in spec.devices):
        return "devices must be a list of non-negative integers"
    if not isinstance(spec.gpu, bool):
        return "gpu must be true or false"
    if not isinstance(spec.env, dict) or not all(_is_str(k) and _is_str(v) for k, v in spec.env.items()):
        return "env must map strings to strings"
    env_problems = job_env.problems(spec.user_env)
    if env_problems:
        return f"the job's environment: {'; '.join(env_problems)}"
    if not isinstance(spec.program.args, list) or not all(isinstance(a, str) for a in spec.program.args):
        return "program args must be a list of strings"
    if not isinstance(spec.job_dir, str) or (spec.job_dir and not os.path.isabs(spec.job_dir)):
        return "job_dir must be empty or an absolute path"
    if not isinstance(spec.kill_grace_s, int | float) or isinstance(spec.kill_grace_s, bool) or spec.kill_grace_s < 0:
        return "kill_grace_s must be a non-negative number"
    return ""


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_port(port: int) -> None:
    """Refuse a port something else holds, before a TF server would crash on it.

    First a plain bind (no SO_REUSEADDR), which fails for any socket on the port. If only that fails, try again with
    SO_REUSEADDR: on Linux that still fails while anything LISTENs on the port, but succeeds when the port is only
    held by TIME_WAIT leftovers of a killed task's connections. TF's gRPC server sets SO_REUSEADDR and starts fine
    then, so a gang restarted on its old ports within a minute must not be refused.
    """
    try:
        _try_bind(port, reuse=False)
    except OSError as plain:
        try:
            _try_bind(port, reuse=True)
        except OSError:
            raise Refused(TaskEventKind.PORT_CONFLICT, str(plain)) from None
        log.info("port %s: only TIME_WAIT leftovers hold it (%s); launching", port, plain)


def _try_bind(port: int, *, reuse: bool) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))  # noqa: S104 - TF listens on all interfaces, so that is what must be free
