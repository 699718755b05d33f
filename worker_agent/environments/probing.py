"""Probing one task environment: its interpreter, run as the helper uid from a fixed environment with the runtime on
its path, prints one JSON line (worker_agent/runtime/probe.py: Python, TensorFlow and Keras versions, the GPUs
TensorFlow lists, why TensorFlow failed to import), read back bounded.

A probe imports TensorFlow (seconds, hundreds of MiB), so its result is kept per interpreter file: `file_key` is the
path with the modification times of the interpreter and of its site-packages folders (installing or removing a
package changes its folder's), so an upgraded environment is probed again and an unchanged one never is.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Any

from contracts.environments import Environment
from contracts.host_reports import EnvironmentFacts
from worker_agent.environments import as_task
from worker_agent.supervision.identity import closed_ancestor
from worker_agent.supervision.launch import PACKAGE_ROOT

PROBE_TIMEOUT_S = 180.0  # TF's import takes seconds; with CUDA's libraries, on a loaded host, a minute or more
PROBE_MODULE = "worker_agent.runtime.probe"

# What worker_agent/runtime/probe.py prints, for an agent whose runtime has none (stdlib and TensorFlow only).
FALLBACK_PROBE = """
import json, os, platform
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
out = {"python": platform.python_version(), "tensorflow": "", "keras": "", "keras_flavor": "", "gpus": [],
       "cuda_build": "", "cudnn_build": "", "error": ""}
try:
    import tensorflow as tf
    out["tensorflow"] = tf.__version__
    out["gpus"] = [d.name for d in tf.config.list_physical_devices("GPU")]
    info = tf.sysconfig.get_build_info()
    out["cuda_build"] = str(info.get("cuda_version", "") or "")
    out["cudnn_build"] = str(info.get("cudnn_version", "") or "")
    try:
        import keras
        out["keras"] = keras.__version__
    except Exception:
        pass
except Exception as exc:
    out["error"] = (type(exc).__name__ + ": " + str(exc))[:500]
print(json.dumps(out))
"""


def file_key(interpreter: str) -> str:
    """What a probe of `interpreter` depends on, as a string ("" when the file is missing)."""
    try:
        linked, target = os.lstat(interpreter), os.stat(interpreter)
    except OSError:
        return ""
    prefix = Path(interpreter).parent.parent
    folders = sorted(glob.glob(str(prefix / "lib" / "python3*" / "site-packages")))
    stamps = []
    for folder in folders[:4]:
        try:
            stamps.append(f"{folder}@{os.stat(folder).st_mtime_ns}")
        except OSError:
            continue
    return "|".join([interpreter, str(linked.st_mtime_ns), str(target.st_mtime_ns), str(target.st_size), *stamps])


def runtime_path(workdir: Path) -> list[str]:
    """Where the runtime is for a task's interpreter: the runtime root's copy when the agent has one, else the
    folder holding `worker_agent`."""
    try:
        from worker_agent.supervision.runtime_root import runtime_pythonpath
    except ImportError:
        return [str(PACKAGE_ROOT)]
    return [str(p) for p in runtime_pythonpath(workdir)]


def command(interpreter: str) -> list[str]:
    has_module = (PACKAGE_ROOT / "worker_agent" / "runtime" / "probe.py").is_file()
    # -s: no user site-packages (the helper's home is nobody's); not -I/-E: PYTHONPATH carries the runtime.
    return [interpreter, "-s", "-m", PROBE_MODULE] if has_module else [interpreter, "-s", "-c", FALLBACK_PROBE]


def probe(environment: Environment, helper: as_task.Helper, workdir: Path) -> dict[str, Any]:
    """The probe's JSON object, or {"error": why} when it could not be had."""
    if not os.path.isfile(environment.interpreter):
        return {"error": f"{environment.interpreter} does not exist on this host"}
    closed = closed_ancestor(Path(environment.interpreter)) if helper.uid is not None else None
    if closed is not None:  # what identity.py's start-up check says of the agent's own interpreter, for this one
        return {"error": f"task uids cannot run {environment.interpreter}: {closed} is closed to other users"}
    env = as_task.fixed_env(
        workdir, PYTHONPATH=os.pathsep.join(runtime_path(workdir)), HOME="/", TF_CPP_MIN_LOG_LEVEL="2"
    )
    ran = as_task.run(helper, command(environment.interpreter), env, PROBE_TIMEOUT_S)
    if ran.returncode is None:
        return {"error": f"the probe did not finish within {PROBE_TIMEOUT_S:.0f} s"}
    for line in reversed(ran.stdout.strip().splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    said = ran.stderr.strip().splitlines()
    return {"error": f"the probe exited {ran.returncode}: {said[-1][:300] if said else 'and printed nothing'}"}


def facts_of(environment: Environment, found: dict[str, Any], nvml_gpus: int, nvml_driver: str) -> EnvironmentFacts:
    """The report of one environment from its probe and the host's NVML view."""
    tensorflow = _text(found.get("tensorflow"))
    error = _text(found.get("error"), 1000)
    ok = bool(tensorflow) and not error
    if not tensorflow and not error:
        error = "TensorFlow is not installed in it"
    gpus = found.get("gpus") if isinstance(found.get("gpus"), list) else []
    return EnvironmentFacts(
        name=environment.name,
        interpreter=environment.interpreter,
        ok=ok,
        python=_text(found.get("python")),
        tensorflow=tensorflow,
        keras=_text(found.get("keras")),
        gpus_visible=min(len(gpus), 64),
        gpu_reason=reason(nvml_gpus, nvml_driver, found) if ok else "",
        error=error,
    )


def reason(nvml_gpus: int, nvml_driver: str, found: dict[str, Any]) -> str:
    """Why the environment's TensorFlow cannot use the host's GPUs ("" when it can, or there are none)."""
    try:
        from worker_agent.environments.gpu_reason import gpu_reason
    except ImportError:
        gpu_reason = _fallback_reason
    return _text(gpu_reason(nvml_gpus, nvml_driver, found), 1000)


def _fallback_reason(nvml_gpu_count: int, nvml_driver: str, probe: dict[str, Any]) -> str:
    if nvml_gpu_count <= 0 or probe.get("gpus"):
        return ""
    cuda = probe.get("cuda_build") or ""
    if not cuda:
        return (
            f"NVML shows {nvml_gpu_count} GPU(s) but this TensorFlow {probe.get('tensorflow', '')} is built without "
            "CUDA (e.g. tensorflow-cpu): install tensorflow[and-cuda] in the environment"
        )
    return (
        f"NVML shows {nvml_gpu_count} GPU(s) (driver {nvml_driver or 'unknown'}) but TensorFlow, built for CUDA "
        f"{cuda}, sees none: install its CUDA libraries (pip install tensorflow[and-cuda]) or a driver new enough"
    )


def _text(value: Any, limit: int = 50) -> str:
    return value[:limit] if isinstance(value, str) else ""
