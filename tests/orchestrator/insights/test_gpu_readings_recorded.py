"""The agent's GPU readings from a real GPU, judged by the product's own code: no machine of the suite has a GPU,
so `scripts/device/gpu_shared.py` ran the agent's facts and sampler on a lent NVIDIA H200 (driver 580.159.04,
2026-11-28) with two CUDA processes on the GPU, and recorded what they read (data/h200_gpu_readings.json). Here those
readings go the way a host's samples go: the ingest's wire check (contracts/host_samples.py), the stored rows, and
the slow-worker insight, which names the GPU shared when the slow worker's process is one of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts.host_reports import parse_facts
from contracts.host_samples import parse_sample
from orchestrator.insights import slow_worker
from orchestrator.models import HostSample, Task
from tests.orchestrator.insights.test_slow_worker import LOADED, ps_job, store_cpu, store_pace

pytestmark = pytest.mark.django_db

RECORDED = json.loads((Path(__file__).parent / "data" / "h200_gpu_readings.json").read_text())


def test_the_agents_facts_of_a_real_gpu_pass_the_wire_check():
    facts = parse_facts({"cpu_count": 16, "memory_total_mb": 131072, "gpus": RECORDED["facts"]})
    [gpu] = facts.gpus
    assert (gpu.index, gpu.name, gpu.memory_total_mb) == (0, "NVIDIA H200", 143771)
    assert gpu.uuid.startswith("GPU-")


def test_a_slow_worker_sharing_a_real_gpu_with_another_process_is_told_so(alice):  # type: ignore[no-untyped-def]
    job, tasks = ps_job(alice)
    Task.objects.filter(pk=tasks["worker1"].pk).update(pid=RECORDED["task_pid"])  # the "task" process on the GPU
    store_pace(job, tasks["chief"], LOADED + LOADED[:1])
    store_cpu(job, tasks["worker1"], 50.0, 10)
    store_cpu(job, tasks["ps"], 30.0, 10)
    host = tasks["worker1"].host
    readings = RECORDED["readings"][:10]
    for n, gpus in enumerate(readings):
        sample = parse_sample({"ts": 1000.0 + 2 * n, "cpu_percent": 40.0, "memory_used_mb": 1024,
                               "memory_total_mb": 131072, "gpus": gpus})  # fmt: skip
        HostSample.objects.create(host=host, ts=sample["ts"], cpu_percent=sample["cpu_percent"], gpus=sample["gpus"])

    [named] = slow_worker.judge(job)["workers"]  # type: ignore[index]

    busy = sorted(g[0]["utilization_percent"] for g in readings)
    median = (busy[4] + busy[5]) / 2
    assert named["host_notes"] == [f"GPU shared (GPU 0 also runs 1 other process, {median:.0f}% utilized)"]


def test_the_same_gpu_running_only_this_jobs_processes_is_not_called_shared(alice):  # type: ignore[no-untyped-def]
    job, tasks = ps_job(alice)
    Task.objects.filter(pk=tasks["worker1"].pk).update(pid=RECORDED["task_pid"])
    Task.objects.filter(pk=tasks["ps"].pk).update(pid=RECORDED["other_pid"])  # the other process is the job's own ps
    store_pace(job, tasks["chief"], LOADED + LOADED[:1])
    store_cpu(job, tasks["worker1"], 50.0, 10)
    store_cpu(job, tasks["ps"], 30.0, 10)
    for n, gpus in enumerate(RECORDED["readings"][:10]):
        HostSample.objects.create(host=tasks["worker1"].host, ts=1000.0 + 2 * n, cpu_percent=40.0, gpus=gpus)

    [named] = slow_worker.judge(job)["workers"]  # type: ignore[index]

    assert named["host_notes"] == []
