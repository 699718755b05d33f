"""Why an environment's TensorFlow cannot use this host's GPUs, in one sentence for the host page: `gpu_reason`.

Compares what NVML reports (the agent's sampler: GPU count, driver version) with what the environment's TensorFlow
saw (worker_agent/runtime/probe.py's line). A host whose GPUs its environment cannot use gets no GPU task for it:
its job would train on the CPU while the page showed the GPUs "in use".

Driver floors (NVIDIA's CUDA Toolkit release notes, table 3: "minimum required driver version for CUDA minor version
compatibility", Linux x86_64): a TensorFlow built for CUDA 11.x needs driver >= 450.80.02, 12.x needs >= 525.60.13,
13.x needs >= 580.65.06. Newer minor releases of one CUDA major run on that major's floor (PTX compiled for a newer
minor may still need the newer driver, which TensorFlow then says in its log).
"""

from __future__ import annotations

from typing import Any

# CUDA major -> the oldest Linux driver that runs it (minor version compatibility).
DRIVER_FLOOR: dict[int, tuple[int, ...]] = {
    11: (450, 80, 2),
    12: (525, 60, 13),
    13: (580, 65, 6),
}
GPU_INSTALL_DOC = "docs/admin/gpu-environments.md"


def gpu_reason(nvml_gpu_count: int, nvml_driver: str, probe: dict[str, Any]) -> str:
    """ "" when the environment's TensorFlow can use the host's GPUs (or the host has none), else one sentence saying
    why not and what to install."""
    if nvml_gpu_count <= 0:
        return ""
    tensorflow = str(probe.get("tensorflow") or "")
    error = str(probe.get("error") or "")
    if not tensorflow:
        said = f" ({error})" if error else ""
        return (
            f"This environment's TensorFlow does not import{said}: install it with its CUDA libraries, e.g. "
            f"`pip install 'tensorflow[and-cuda]'` in its venv ({GPU_INSTALL_DOC})."
        )
    gpus = probe.get("gpus") or []
    seen = len(gpus) if isinstance(gpus, list) else 0
    cuda = str(probe.get("cuda_build") or "")
    if not cuda:
        return (
            f"TensorFlow {tensorflow} here is a CPU-only build (tensorflow-cpu, or a wheel built without CUDA), so it "
            f"cannot use the {_gpus(nvml_gpu_count)} NVML reports: install `pip install 'tensorflow[and-cuda]=="
            f"{tensorflow}'` in this environment instead ({GPU_INSTALL_DOC})."
        )
    if seen == 0:
        floor = driver_floor(cuda)
        driver = parse_driver(nvml_driver)
        if floor is not None and driver is not None and driver < floor:
            return (
                f"TensorFlow {tensorflow} is built for CUDA {cuda}, which needs NVIDIA driver "
                f"{_dotted(floor)} or newer; this host's driver is {nvml_driver}: upgrade the driver, or use a "
                f"TensorFlow built for an older CUDA ({GPU_INSTALL_DOC})."
            )
        if error:
            return f"TensorFlow {tensorflow} could not list its GPUs ({error}) ({GPU_INSTALL_DOC})."
        return (
            f"TensorFlow {tensorflow} is built with CUDA {cuda} but sees none of the {_gpus(nvml_gpu_count)} NVML "
            f"reports: its CUDA libraries are missing (install `pip install 'tensorflow[and-cuda]=={tensorflow}'` in "
            f"this environment, which brings them as pip packages), or CUDA_VISIBLE_DEVICES in the agent's "
            f"environment hides them ({GPU_INSTALL_DOC})."
        )
    if seen < nvml_gpu_count:
        return (
            f"TensorFlow {tensorflow} sees {seen} of the {_gpus(nvml_gpu_count)} NVML reports: CUDA_VISIBLE_DEVICES in "
            f"the agent's environment hides some, or they are in a state CUDA cannot use (see `nvidia-smi`)."
        )
    return ""


def driver_floor(cuda_build: str) -> tuple[int, ...] | None:
    """The oldest driver that runs this CUDA build ("12.2" -> 525.60.13); None for a CUDA this table does not know."""
    try:
        major = int(cuda_build.split(".", maxsplit=1)[0])
    except ValueError:
        return None
    return DRIVER_FLOOR.get(major)


def parse_driver(version: str) -> tuple[int, ...] | None:
    """NVML's driver version ("535.104.05") as numbers; None when it is unknown or not numbers."""
    try:
        parts = tuple(int(part) for part in version.strip().split("."))
    except ValueError:
        return None
    return parts or None


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(f"{part:02d}" if i else str(part) for i, part in enumerate(version))


def _gpus(count: int) -> str:
    return "GPU" if count == 1 else f"{count} GPUs"
