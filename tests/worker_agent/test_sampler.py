"""The host sampler reads CPU, memory and GPUs (a fake NVML here: this machine has none) and sends every sample to the
metrics queue within the flush period; metric traffic from task pipes goes to the same queue."""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import psutil
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contracts import broker
from contracts.host_samples import parse_gpu, parse_sample
from contracts.protocol import (
    HOST_SAMPLES,
    METRICS_FLUSH_S,
    TASK_ARTIFACT,
    TASK_EVENT,
    TASK_METRICS,
)
from contracts.signing import public_key_text
from tests.support.processes import wait_until
from worker_agent.app import Agent
from worker_agent.cli import parse_args
from worker_agent.folders import Roots
from worker_agent.outbox import Outbox
from worker_agent.sampler import MIB, GpuReader, Sampler
from worker_agent.supervision.metrics_pipe import MetricsPipe

SLACK_S = 0.05  # scheduling jitter of a loaded test machine on top of the 200 ms promise
GPU_KEYS = {
    "index",
    "name",
    "utilization_percent",
    "memory_used_mb",
    "memory_total_mb",
    "temperature_c",
    "power_w",
    "processes",
}


class Captured:
    """An outbox-like send function: keeps (name, body, queue, wall time sent)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages: list[tuple[str, dict[str, Any], str, float]] = []

    def __call__(self, name: str, body: dict[str, Any], queue: str = broker.EVENTS) -> None:
        with self._lock:
            self.messages.append((name, body, queue, time.time()))

    def samples(self) -> list[dict[str, Any]]:
        with self._lock:
            return [s for _, body, _, _ in self.messages for s in body["samples"]]


def fake_nvml(*, init_error: str = "") -> ModuleType:
    """A pynvml stand-in with two GPUs: GPU 1 has no temperature sensor, GPU 0 reads everything."""
    nvml = ModuleType("fake_pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def init() -> None:
        nvml.calls.append("init")
        if init_error:
            raise NVMLError(init_error)

    def temperature(handle: int, sensor: int) -> int:
        assert sensor == nvml.NVML_TEMPERATURE_GPU
        if handle == 1:
            raise NVMLError_NotSupported("Not Supported")
        return 61

    processes = {
        0: [SimpleNamespace(pid=4242, usedGpuMemory=2048 * MIB), SimpleNamespace(pid=4343, usedGpuMemory=None)],
        1: [],
    }
    nvml.calls = []
    nvml.NVMLError = NVMLError
    nvml.NVMLError_NotSupported = NVMLError_NotSupported
    nvml.NVML_TEMPERATURE_GPU = 0
    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: nvml.calls.append("shutdown")
    nvml.nvmlDeviceGetCount = lambda: 2
    nvml.nvmlDeviceGetHandleByIndex = lambda index: index
    nvml.nvmlDeviceGetName = lambda h: [b"NVIDIA H100 80GB HBM3", "NVIDIA A10"][h]  # pynvml gives bytes or str
    nvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=[87, 3][h], memory=40)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=[30000, 100][h] * MIB, total=[81559, 23028][h] * MIB)
    nvml.nvmlDeviceGetTemperature = temperature
    nvml.nvmlDeviceGetPowerUsage = lambda h: [312_500, 55_000][h]  # milliwatts
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: processes[h]
    return nvml


def nvml_works() -> bool:
    reader = GpuReader()
    try:
        return reader.open() == ""
    finally:
        reader.close()


@pytest.fixture
def sent() -> Captured:
    return Captured()


@pytest.fixture
def start_sampler(sent: Captured) -> Iterator[Any]:
    started: list[Sampler] = []

    def start(**kwargs: Any) -> Sampler:
        sampler = Sampler(sent, **kwargs)
        sampler.start()
        started.append(sampler)
        return sampler

    yield start
    for sampler in started:
        sampler.stop()


@pytest.mark.skipif(nvml_works(), reason="this host has NVML: the CPU-host case cannot be seen here")
def test_a_sample_of_this_cpu_host(start_sampler, sent):
    start_sampler(interval_s=0.1)

    sample = wait_until(lambda: sent.samples()[:1], timeout=5, what="a first sample")[0]

    memory = psutil.virtual_memory()
    assert set(sample) == {"ts", "cpu_percent", "memory_used_mb", "memory_total_mb", "gpu_error", "gpus"}
    assert abs(sample["ts"] - time.time()) < 5
    assert 0 <= sample["cpu_percent"] <= 100 * (psutil.cpu_count() or 1)
    assert sample["memory_total_mb"] == memory.total // MIB
    assert abs(sample["memory_used_mb"] - (memory.total - memory.available) / MIB) < 0.1 * memory.total / MIB
    assert sample["gpus"] == []
    assert sample["gpu_error"].startswith("no GPU")
    json.dumps(sample)  # it travels as JSON
    assert parse_sample(sample) == sample  # and passes the ingest's check as it is


# At 0.1 s, a batch holds at most what fits in METRICS_FLUSH_S after its first sample: 2 when every tick is on time,
# 3 when the first one woke late (a loaded machine) and the next two on time; each still leaves within the period.
@pytest.mark.parametrize(("interval", "most_per_message"), [(0.25, 1), (0.1, 3)])
def test_every_sample_goes_to_the_metrics_queue_within_the_flush_period(
    start_sampler, sent, interval, most_per_message
):
    start_sampler(interval_s=interval)

    wait_until(lambda: len(sent.samples()) >= 6, timeout=10, what="six samples")

    for name, body, queue, sent_at in list(sent.messages):
        assert (name, queue) == (HOST_SAMPLES, broker.METRICS)
        assert set(body) == {"samples"} and 1 <= len(body["samples"]) <= most_per_message
        for sample in body["samples"]:
            assert sent_at - sample["ts"] <= METRICS_FLUSH_S + SLACK_S
    stamps = [s["ts"] for s in sent.samples()]
    assert stamps == sorted(stamps)
    assert all(later - earlier > interval / 2 for earlier, later in itertools.pairwise(stamps))


def test_gpu_fields_are_read_one_by_one_and_an_unsupported_one_is_null(caplog):
    nvml = fake_nvml()
    reader = GpuReader(nvml)

    assert reader.open() == ""
    with caplog.at_level(logging.INFO, logger="worker_agent.sampler"):
        gpus = [reader.read() for _ in range(3)][-1]
    reader.close()

    assert [set(g) for g in gpus] == [GPU_KEYS, GPU_KEYS]
    h100, a10 = gpus
    assert h100 == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "utilization_percent": 87.0,
        "memory_used_mb": 30000,
        "memory_total_mb": 81559,
        "temperature_c": 61.0,
        "power_w": 312.5,
        "processes": [{"pid": 4242, "used_memory_mb": 2048}, {"pid": 4343, "used_memory_mb": None}],
    }
    assert a10["temperature_c"] is None  # not supported on that board ...
    assert (a10["name"], a10["utilization_percent"], a10["memory_used_mb"], a10["power_w"]) == (
        "NVIDIA A10",
        3.0,
        100,
        55.0,
    )  # ... and everything else still read
    assert a10["processes"] == []
    assert [parse_gpu(g) for g in gpus] == gpus  # what the ingest stores, as it was read
    unreadable = [r for r in caplog.records if "cannot read" in r.getMessage()]
    assert len(unreadable) == 1 and "GPU 1: cannot read temperature" in unreadable[0].getMessage()  # once, not per tick
    assert nvml.calls == ["init", "shutdown"]


def test_the_sampler_initialises_nvml_once_and_shuts_it_down_at_stop(start_sampler, sent):
    nvml = fake_nvml()
    sampler = start_sampler(interval_s=0.1, nvml=nvml)

    wait_until(lambda: len(sent.samples()) >= 3, timeout=10, what="three samples")
    sampler.stop()

    samples = sent.samples()
    assert all(s["gpu_error"] == "" and [g["index"] for g in s["gpus"]] == [0, 1] for s in samples)
    assert samples[-1]["gpus"][1]["temperature_c"] is None
    assert nvml.calls == ["init", "shutdown"]


def test_without_nvml_the_samples_say_why_and_nothing_is_shut_down():
    nvml = fake_nvml(init_error="Driver Not Loaded")
    reader = GpuReader(nvml)

    assert reader.open() == "no GPU: NVML unavailable (Driver Not Loaded)"
    assert reader.read() == []
    reader.close()
    assert nvml.calls == ["init"]


def test_the_sampler_stops_promptly_mid_interval(start_sampler, sent):
    sampler = start_sampler(interval_s=60)
    wait_until(lambda: sampler.gpus.error or sampler.gpus.count, timeout=5, what="the sampler to start")

    started = time.monotonic()
    sampler.stop()

    assert time.monotonic() - started < 1
    assert sampler._thread is not None and not sampler._thread.is_alive()
    assert sent.messages == []  # nothing was due yet


def test_a_failing_send_does_not_end_the_sampling(start_sampler, sent):
    calls = []

    def flaky(name: str, body: dict[str, Any], queue: str = broker.EVENTS) -> None:
        calls.append(name)
        if len(calls) == 1:
            raise ConnectionError("an injected sender that raises")
        sent(name, body, queue)

    sampler = Sampler(flaky, interval_s=0.1)
    sampler.start()
    try:
        wait_until(lambda: len(sent.samples()) >= 2, timeout=10, what="samples after the failure")
    finally:
        sampler.stop()
    assert sampler.failures == 1


@pytest.mark.parametrize("interval", [0.05, 60.5, 0, float("nan")])
def test_the_sampler_refuses_an_interval_out_of_range(interval):
    with pytest.raises(ValueError, match=r"between 0\.1 and 60"):
        Sampler(Captured(), interval_s=interval)


@pytest.fixture
def agent_args(tmp_path) -> list[str]:  # type: ignore[no-untyped-def]
    """What every agent command line needs besides the interval: a host, a token file, the control key."""
    token_file = tmp_path / "token"
    token_file.write_text("tfa_t")
    control_key = public_key_text(Ed25519PrivateKey.generate().public_key())
    return ["--host", "a", "--token-file", str(token_file), "--control-key", control_key]


@pytest.mark.parametrize("value", ["0.05", "61", "nan", "-1"])
def test_the_cli_refuses_a_sample_interval_out_of_range(value, capsys, agent_args):
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*agent_args, "--sample-interval", value])

    assert exit_info.value.code == 2
    assert "--sample-interval must be between 0.1 and 60 seconds" in capsys.readouterr().err


def test_the_cli_takes_the_sample_interval_from_flag_env_or_default(monkeypatch, capsys, agent_args):
    monkeypatch.delenv("TFDASH_SAMPLE_INTERVAL", raising=False)
    assert parse_args(agent_args).sample_interval == 1.0
    assert parse_args([*agent_args, "--sample-interval", "0.1"]).sample_interval == 0.1
    monkeypatch.setenv("TFDASH_SAMPLE_INTERVAL", "5")
    assert parse_args(agent_args).sample_interval == 5.0
    monkeypatch.setenv("TFDASH_SAMPLE_INTERVAL", "often")
    with pytest.raises(SystemExit):
        parse_args(agent_args)
    assert "invalid float value: 'often'" in capsys.readouterr().err


def run_pipe(send: Any, lines: list[dict[str, Any]], folder: Path | None = None) -> MetricsPipe:
    """Feed `lines` through a metrics pipe (as a task would, its artifacts in `folder`), then close it as at the
    task's exit."""
    artifacts_from = None if folder is None else Roots.agent(folder)
    pipe = MetricsPipe(task_id=31, attempt=2, send=send, artifacts_from=artifacts_from)
    pipe.start("test")
    os.write(pipe.write_fd, b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    pipe.child_started()  # closes our write end: EOF
    pipe.finish(5)
    return pipe


def test_task_metrics_and_artifacts_go_to_the_metrics_queue(sent, tmp_path: Path):
    model = tmp_path / "model.keras"
    model.write_bytes(b"weights")

    run_pipe(
        sent,
        [
            {"kind": "metric", "ts": 1.0, "step": 1, "metrics": {"loss": 0.5}},
            {"kind": "artifact", "ts": 2.0, "name": "model.keras", "path": str(model)},
        ],
        tmp_path,
    )

    assert [(name, queue) for name, _, queue, _ in sent.messages] == [
        (TASK_METRICS, broker.METRICS),
        (TASK_ARTIFACT, broker.METRICS),
    ]


def test_the_agent_routes_the_supervisors_reports_by_queue(tmp_path: Path):
    agent = Agent(
        server="redis://127.0.0.1:1/0",
        host="gpu-1",
        mac_key=b"k" * 32,
        control_key=Ed25519PrivateKey.generate().public_key(),
        workdir=tmp_path,
        sample_interval_s=2.5,
    )
    delivered: list[tuple[str, str]] = []
    agent.outbox.stop()
    agent.outbox = Outbox(
        agent.app, "gpu-1", b"k" * 32, transport=lambda name, envelope, queue: delivered.append((name, queue))
    )
    try:
        agent._report(TASK_EVENT, {"n": 0})  # the supervisor's own (name, body) calls: events, logs
        run_pipe(agent._report, [{"kind": "metric", "ts": 1.0, "step": 1, "metrics": {}}])  # its metrics pipes
        assert agent.outbox.flush(5)
    finally:
        agent.outbox.stop()

    assert delivered == [(TASK_EVENT, broker.EVENTS), (TASK_METRICS, broker.METRICS)]
    assert agent.sampler.interval_s == 2.5
