"""Host samples: CPU, memory and per-GPU readings every `interval_s`, sent as HOST_SAMPLES to the METRICS stream.

One daemon thread takes a sample per tick and hands it to the outbox within METRICS_FLUSH_S of taking it: at the
default 1 Hz that is one sample per message; only intervals shorter than the flush period batch several. NVML is
initialised once when the thread starts and shut down when it stops. A host without NVML (a CPU host) is not an
error: its samples carry no GPUs and say why, and that is logged once. A GPU field NVML cannot read (not supported on
that board, a GPU that fell off the bus) becomes None; no reading failure ever ends the sampling.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from types import ModuleType
from typing import Any

import psutil

from contracts import broker
from contracts.metric_messages import HostSampleBatch
from contracts.protocol import HOST_SAMPLES, METRICS_FLUSH_S

log = logging.getLogger(__name__)

# `send(task_name, body, queue=...)`: the outbox's send.
SendFn = Callable[..., None]

MIB = 1024 * 1024
DEFAULT_INTERVAL_S = 1.0
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 60.0
STOP_JOIN_S = 5.0
WARN_EVERY_S = 60.0


class GpuReader:
    """Per-GPU readings through an NVML module: pynvml by default, a fake one in tests. Use from one thread."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml
        self._initialised = False
        self._gpus: list[tuple[int, Any, str | None]] = []  # (index, handle, name), found once at open()
        self._unreadable: set[tuple[int, str]] = set()  # (index, field) already logged as unreadable
        self.error = ""

    @property
    def count(self) -> int:
        return len(self._gpus)

    def open(self) -> str:
        """Initialise NVML and find the GPUs; returns "" or why there are none ("no GPU: ...", also in `error`)."""
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                self.error = "no GPU: nvidia-ml-py is not installed"
                return self.error
            self._nvml = nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: a host without usable GPUs
            self.error = f"no GPU: NVML unavailable ({exc})"
            return self.error
        self._initialised = True
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except Exception as exc:
            self.close()
            self.error = f"no GPU: NVML could not list the GPUs ({exc})"
            return self.error
        # The name never changes: read once, not every second.
        self._gpus = [
            (index, handle, self._field(index, "name", lambda h=handle: _text(nvml.nvmlDeviceGetName(h))))
            for index, handle in enumerate(handles)
        ]
        self.error = ""
        return ""

    def close(self) -> None:
        if not self._initialised:
            return
        self._initialised = False
        self._gpus = []
        try:
            self._nvml.nvmlShutdown()  # type: ignore[union-attr]
        except Exception as exc:  # nothing left to do about it: the agent is stopping the sampler anyway
            log.debug("nvmlShutdown failed: %s", exc)

    def read(self) -> list[dict[str, Any]]:
        """One reading of every GPU found at open(), each field read on its own (None when unreadable)."""
        nvml = self._nvml
        gpus = []
        for index, handle, name in self._gpus:
            memory = self._field(index, "memory", lambda h=handle: _memory_mb(nvml.nvmlDeviceGetMemoryInfo(h)))
            gpus.append(
                {
                    "index": index,
                    "name": name,
                    "utilization_percent": self._field(
                        index, "utilization", lambda h=handle: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
                    ),
                    "memory_used_mb": memory[0] if memory else None,
                    "memory_total_mb": memory[1] if memory else None,
                    "temperature_c": self._field(
                        index,
                        "temperature",
                        lambda h=handle: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
                    ),
                    "power_w": self._field(index, "power", lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h) / 1000),
                    "processes": self._field(
                        index, "processes", lambda h=handle: _processes(nvml.nvmlDeviceGetComputeRunningProcesses(h))
                    ),
                }
            )
        return gpus

    def _field(self, index: int, field: str, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except Exception as exc:  # NVMLError_NotSupported and the like; any other failure is just as unreadable
            if (index, field) not in self._unreadable:  # once per field: a board lacking it would log every tick
                self._unreadable.add((index, field))
                log.info("GPU %d: cannot read %s (%s): reported as null", index, field, exc)
            return None


class Sampler:
    """The sampling thread. `start()` with the agent's heartbeat, `stop()` on shutdown (sends what it holds)."""

    def __init__(
        self,
        send: SendFn,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        nvml: ModuleType | None = None,
    ) -> None:
        if not MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S:
            raise ValueError(f"sample interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S} s")
        self._send = send
        self.interval_s = interval_s
        self.gpus = GpuReader(nvml)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending: list[dict[str, Any]] = []
        self._first_at = 0.0  # monotonic time the oldest pending sample was taken
        self._last_warned_at = -WARN_EVERY_S
        self.sent_samples = 0
        self.failures = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = STOP_JOIN_S) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("host sampler still busy %.1f s after stop (a hanging NVML call?)", timeout)

    def sample(self) -> dict[str, Any]:
        """One reading of the host, shaped as in metric_messages.HostSampleBatch."""
        ts = time.time()
        memory = psutil.virtual_memory()
        return {
            "ts": ts,
            # System-wide, 0-100, over the time since the previous call (primed in _run).
            "cpu_percent": float(psutil.cpu_percent(interval=None)),
            # total - available, as `free` and top count "used": page cache the kernel would give back is not used.
            "memory_used_mb": int((memory.total - memory.available) // MIB),
            "memory_total_mb": int(memory.total // MIB),
            "gpu_error": self.gpus.error,
            "gpus": self.gpus.read(),
        }

    # --- the thread -----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        error = self.gpus.open()
        if error:
            log.info("host sampler: every %.2g s, CPU and memory only (%s)", self.interval_s, error)
        else:
            log.info("host sampler: every %.2g s, %d GPU(s) through NVML", self.interval_s, self.gpus.count)
        # cpu_percent(interval=None) measures since its previous call: the first call only sets the start, so the
        # first sample comes one interval later and covers that whole interval.
        psutil.cpu_percent(interval=None)
        next_at = time.monotonic() + self.interval_s
        try:
            while not self._stopping.wait(max(0.0, next_at - time.monotonic())):
                self._tick()
                now = time.monotonic()
                next_at += self.interval_s
                if next_at <= now:  # fell behind (slow NVML, a suspended host): skip the missed ticks, no burst
                    next_at = now + self.interval_s
        finally:
            self._flush()
            self.gpus.close()

    def _tick(self) -> None:
        try:
            taken_at = time.monotonic()
            sample = self.sample()
        except Exception:  # psutil should not fail; if it does, this tick is lost, not the sampler
            self._warn("host sampler: could not take a sample")
            return
        if not self._pending:
            self._first_at = taken_at
        self._pending.append(sample)
        # Send now unless the next sample can still join this batch in time: every sample leaves within
        # METRICS_FLUSH_S of being taken, so at intervals >= METRICS_FLUSH_S each one leaves alone, at once.
        if time.monotonic() + self.interval_s > self._first_at + METRICS_FLUSH_S:
            self._flush()

    def _flush(self) -> None:
        samples, self._pending = self._pending, []
        if not samples:
            return
        try:
            self._send(HOST_SAMPLES, asdict(HostSampleBatch(samples=samples)), queue=broker.METRICS)
        except Exception:  # the outbox never raises; an injected sender might, and must not end the sampler
            self._warn("host sampler: could not hand on %d sample(s)", len(samples))
            return
        self.sent_samples += len(samples)

    def _warn(self, message: str, *args: Any) -> None:
        self.failures += 1
        now = time.monotonic()
        if now - self._last_warned_at >= WARN_EVERY_S:  # a failure that repeats every tick logs once a minute
            self._last_warned_at = now
            log.exception(message + " (%d failure(s) so far)", *args, self.failures)


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _memory_mb(info: Any) -> tuple[int, int]:
    return int(info.used // MIB), int(info.total // MIB)


def _processes(running: Any) -> list[dict[str, Any]]:
    # usedGpuMemory is None when NVML cannot tell (e.g. on Windows WDDM or without the needed privileges).
    return [
        {"pid": int(p.pid), "used_memory_mb": None if p.usedGpuMemory is None else int(p.usedGpuMemory // MIB)}
        for p in running
    ]
