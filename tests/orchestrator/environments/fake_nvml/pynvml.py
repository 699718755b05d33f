"""A stand-in for nvidia-ml-py on an agent's PYTHONPATH (tests only: this machine has no GPU): NVML shows two GPUs,
so the agent reports them, while its task environments' TensorFlow (tensorflow-cpu here) sees none."""

from __future__ import annotations

from types import SimpleNamespace

NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    pass


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    return "550.54.15"


def nvmlDeviceGetCount() -> int:
    return 2


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return "Simulated GPU"


def nvmlDeviceGetUUID(handle: int) -> str:
    return f"GPU-simulated-{handle}"


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    return SimpleNamespace(total=16 * 1024**3, used=0, free=16 * 1024**3)


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    return SimpleNamespace(gpu=0, memory=0)


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    return 40


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    return 50_000


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[object]:
    return []
