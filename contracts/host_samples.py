"""Host samples (HOST_SAMPLES; the shape is metric_messages.HostSampleBatch's): the one check of a sample, used by the
ingest before it stores one (`parse_sample`, strict: a sample that is not what an agent sends is refused whole) and by
every reader of stored ones (`readable_gpus`, lenient: rows stored before the check may hold anything, and a page must
not fail on them, nor draw junk). Bounds are those of a host's facts (contracts/limits.py)."""

from __future__ import annotations

import math
from typing import Any

from contracts.limits import MAX_HOST_GPUS, MAX_HOST_MEMORY_MB

MAX_GPU_INDEX = MAX_HOST_GPUS * 16  # as parse_facts: NVML indexes a board's GPUs from 0
MAX_GPU_PROCESSES = 1024  # per GPU, per sample
MAX_PID = 2**31
MAX_NAME_CHARS = 200
MAX_ERROR_CHARS = 500


def parse_sample(raw: Any) -> dict[str, Any]:
    """One sample as the ingest stores it (its known keys only), or ValueError saying what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError("a sample is not an object")
    gpus = raw.get("gpus", [])
    if not isinstance(gpus, list) or len(gpus) > MAX_HOST_GPUS:
        raise ValueError(f"gpus is not a list of at most {MAX_HOST_GPUS}")
    ts = _number(raw.get("ts"), "ts", 0.0, 2.0**40)
    if ts is None:
        raise ValueError("ts is missing")
    return {
        "ts": ts,
        "cpu_percent": _number(raw.get("cpu_percent"), "cpu_percent", 0.0, 100.0),
        "memory_used_mb": _integer(raw.get("memory_used_mb"), "memory_used_mb", 0, MAX_HOST_MEMORY_MB),
        "memory_total_mb": _integer(raw.get("memory_total_mb"), "memory_total_mb", 0, MAX_HOST_MEMORY_MB),
        "gpu_error": _text(raw.get("gpu_error"), "gpu_error", MAX_ERROR_CHARS),
        "gpus": [parse_gpu(gpu) for gpu in gpus],
    }


def parse_gpu(raw: Any) -> dict[str, Any]:
    """One GPU's reading (the index is required, every reading may be null: NVML could not read it)."""
    if not isinstance(raw, dict):
        raise ValueError("a GPU entry is not an object")
    index = _integer(raw.get("index"), "index", 0, MAX_GPU_INDEX)
    if index is None:
        raise ValueError("a GPU entry has no index")
    processes = raw.get("processes")
    if processes is not None and (not isinstance(processes, list) or len(processes) > MAX_GPU_PROCESSES):
        raise ValueError(f"processes is not a list of at most {MAX_GPU_PROCESSES}")
    # "utilization": what samples were called before "utilization_percent".
    utilization = raw.get("utilization_percent", raw.get("utilization"))
    return {
        "index": index,
        "name": _text(raw.get("name"), "name", MAX_NAME_CHARS),
        "utilization_percent": _number(utilization, "utilization_percent", 0.0, 100.0),
        "memory_used_mb": _integer(raw.get("memory_used_mb"), "memory_used_mb", 0, MAX_HOST_MEMORY_MB),
        "memory_total_mb": _integer(raw.get("memory_total_mb"), "memory_total_mb", 0, MAX_HOST_MEMORY_MB),
        "temperature_c": _number(raw.get("temperature_c"), "temperature_c", -273.15, 1000.0),
        "power_w": _number(raw.get("power_w"), "power_w", 0.0, 100_000.0),
        "processes": None if processes is None else [_process(p) for p in processes],
    }


# A GPU entry's readings, number or null: what the pages and the API show of a stored sample.
READINGS = ("utilization_percent", "memory_used_mb", "memory_total_mb", "temperature_c", "power_w")


def readable_gpus(stored: Any) -> list[dict[str, Any]]:
    """A stored sample's GPU entries as the pages and the API show them: an entry without an integer index in bounds
    is left out, a reading that is not a finite number is null, a name that is not a string is empty. Lenient and
    cheap (it runs on every stored sample a page loads): the ingest has checked new samples strictly already."""
    if type(stored) is not list:
        return []
    readable = []
    for gpu in stored[:MAX_HOST_GPUS]:
        if type(gpu) is not dict:
            continue
        index = gpu.get("index")
        if type(index) is not int or not 0 <= index <= MAX_GPU_INDEX:
            continue
        name = gpu.get("name")
        processes = gpu.get("processes")
        entry: dict[str, Any] = {"index": index, "name": name[:MAX_NAME_CHARS] if type(name) is str else ""}
        for key in READINGS:
            value = gpu.get(key)
            if key == "utilization_percent" and key not in gpu:
                value = gpu.get("utilization")  # the key's name before
            entry[key] = value if (type(value) is int or type(value) is float) and math.isfinite(value) else None
        entry["processes"] = processes[:MAX_GPU_PROCESSES] if type(processes) is list else None
        readable.append(entry)
    return readable


def _process(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError("a GPU process is not an object")
    pid = _integer(raw.get("pid"), "pid", 0, MAX_PID)
    if pid is None:
        raise ValueError("a GPU process has no pid")
    return {"pid": pid, "used_memory_mb": _integer(raw.get("used_memory_mb"), "used_memory_mb", 0, MAX_HOST_MEMORY_MB)}


def _number(value: Any, name: str, low: float, high: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} is not a number")
    if not low <= value <= high:
        raise ValueError(f"{name} {value} is outside {low}..{high}")
    return float(value)


def _integer(value: Any, name: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} is not an integer")
    if not low <= value <= high:
        raise ValueError(f"{name} {value} is outside {low}..{high}")
    return value


def _text(value: Any, name: str, most: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > most:
        raise ValueError(f"{name} is not a string of at most {most} characters")
    return value
