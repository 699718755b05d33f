"""What an agent reports about its machine: CPUs, memory, GPUs (through NVML), TensorFlow and agent versions."""

from __future__ import annotations

import os
import socket
from importlib.metadata import PackageNotFoundError, version

import psutil

from worker_agent import __version__
from worker_agent.protocol import GpuInfo, HostFacts


def tensorflow_version() -> str:
    # Read from package metadata: importing TensorFlow costs seconds and ~600 MiB in a process that never trains.
    for dist in ("tensorflow-cpu", "tensorflow", "tensorflow-gpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return ""


def nvml_gpus() -> tuple[list[GpuInfo], str]:
    """The GPUs NVML sees, and why none were read when NVML is missing (a CPU host: not an error)."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"no GPU: NVML unavailable ({exc})"
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                GpuInfo(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else name,
                    memory_total_mb=int(memory.total // (1024 * 1024)),
                    uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                )
            )
        return gpus, ""
    except pynvml.NVMLError as exc:
        return [], f"NVML error while listing GPUs: {exc}"
    finally:
        pynvml.nvmlShutdown()


def collect(port_range: tuple[int, int] | None = None) -> HostFacts:
    gpus, gpu_error = nvml_gpus()
    return HostFacts(
        cpu_count=psutil.cpu_count(logical=True) or 1,
        memory_total_mb=int(psutil.virtual_memory().total // (1024 * 1024)),
        gpus=gpus,
        tf_version=tensorflow_version(),
        agent_version=__version__,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        port_range=port_range,
        gpu_error=gpu_error,
    )
