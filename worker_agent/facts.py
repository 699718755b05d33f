"""What an agent reports about its machine: CPUs, memory, GPUs (through NVML), TensorFlow and agent versions."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

import psutil

from contracts.host_reports import GpuInfo, HostFacts
from worker_agent import __version__


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


class RefreshingFacts:
    """`collect()` at most every `refresh_s`: a heartbeat every few seconds must stay cheap (NVML's init and the
    package metadata scan cost milliseconds to tens of them), while what they read almost never changes."""

    def __init__(
        self,
        port_range: tuple[int, int] | None = None,
        refresh_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.port_range = port_range
        self.clock = clock
        self.refresh_s = refresh_s
        self._facts: HostFacts | None = None
        self._at = 0.0

    def __call__(self) -> HostFacts:
        now = self.clock()
        if self._facts is None or now - self._at >= self.refresh_s:
            self._facts = collect(self.port_range)
            self._at = now
        return self._facts
