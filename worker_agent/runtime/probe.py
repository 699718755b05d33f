"""What a task environment's TensorFlow is and which GPUs it sees: one JSON line on stdout, for the agent.

    <interpreter> -m worker_agent.runtime.probe        (PYTHONPATH = runtime_root.runtime_pythonpath(workdir))

prints exactly one line:
    {"python": "3.11.9", "tensorflow": "2.15.1" | "", "keras": "2.15.0" | "", "keras_flavor": "keras2" | "tf_keras" |
     "keras3" | "", "gpus": ["/physical_device:GPU:0", ...], "cuda_build": "12.2" | "", "cudnn_build": "8" | "",
     "error": "" | "why TensorFlow failed to import"}
and exits 0, also when TensorFlow is missing or broken (that is what "error" says). What TensorFlow itself prints,
on either stream, goes to stderr, so stdout holds that line alone. "gpus" is what `tf.config.list_physical_devices`
lists (after CUDA_VISIBLE_DEVICES); "cuda_build" is "" for a TensorFlow built without CUDA (tensorflow-cpu, macOS).
The agent compares it with what NVML reports (worker_agent/environments/gpu_reason.py).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from typing import Any

from worker_agent.runtime.flavour import KERAS2, KERAS3, TF_KERAS, installed_version, keras_flavour

MAX_ERROR_CHARS = 500


def probe() -> dict[str, Any]:
    found: dict[str, Any] = {
        "python": platform.python_version(),
        "tensorflow": "",
        "keras": "",
        "keras_flavor": "",
        "gpus": [],
        "cuda_build": "",
        "cudnn_build": "",
        "error": "",
    }
    try:
        import tensorflow as tf
    except BaseException as exc:  # ImportError, a broken wheel's OSError, even SystemExit from a bad install
        found["error"] = _one_line(f"import tensorflow failed: {type(exc).__name__}: {exc}")
        return found
    found["tensorflow"] = str(getattr(tf, "__version__", ""))
    flavour = keras_flavour()
    found["keras_flavor"] = flavour
    found["keras"] = _keras_version(flavour)
    try:
        build = dict(tf.sysconfig.get_build_info())
        if build.get("is_cuda_build", bool(build.get("cuda_version"))):
            found["cuda_build"] = str(build.get("cuda_version", ""))
            found["cudnn_build"] = str(build.get("cudnn_version", ""))
        found["gpus"] = [device.name for device in tf.config.list_physical_devices("GPU")]
    except Exception as exc:  # the devices could not be listed: say why, keep what is known
        found["error"] = _one_line(f"listing TensorFlow's devices failed: {type(exc).__name__}: {exc}")
    return found


def _keras_version(flavour: str) -> str:
    if flavour == TF_KERAS:
        return installed_version("tf_keras") or installed_version("tf-keras")
    if flavour in (KERAS2, KERAS3):
        return installed_version("keras")
    return ""


def _one_line(text: str) -> str:
    return " ".join(text.split())[:MAX_ERROR_CHARS]


def main() -> int:
    # TensorFlow and its plugins print on stdout too (absl, oneDNN notices): point fd 1 at stderr while they load, so
    # the JSON line is the only thing stdout carries.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        found = probe()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    sys.stdout.write(json.dumps(found, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
