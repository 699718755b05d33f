"""The agent's GPU path on a real NVIDIA GPU, for a lent GPU machine (no TensorFlow needed there).

    python3 scripts/device/gpu_shared.py OUT.json [--seconds 8]

Needs psutil, nvidia-ml-py and cryptography (the agent's own pins) and, for the load, PyTorch with CUDA. It checks
what no machine without a GPU can: the agent's facts find the GPUs (worker_agent/facts.py), its sampler reads them
(worker_agent/sampler.py GpuReader), and with two CUDA processes on one GPU, a "task" and an "other", its readings list
both by the pids this process started them with: what the slow-worker insight's "GPU shared" note matches on
(orchestrator/insights/slow_worker.py). It writes the facts and readings as JSON; the suite reads a recorded copy
(tests/orchestrator/insights/data/) and judges it with the product's own code. Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from worker_agent import facts  # noqa: E402
from worker_agent.sampler import GpuReader  # noqa: E402

# A CUDA process that keeps the GPU busy with matrix products for argv[1] seconds.
LOAD = """
import sys, time, torch
x = torch.randn(4096, 4096, device="cuda")
end = time.time() + float(sys.argv[1])
while time.time() < end:
    y = x @ x
    torch.cuda.synchronize()
"""


def listed_pids(reading: list[dict]) -> set[int]:
    return {p["pid"] for gpu in reading for p in (gpu.get("processes") or [])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=8.0, help="readings taken while both processes run")
    args = parser.parse_args()
    gpus, why = facts.nvml_gpus()
    print(f"facts: {len(gpus)} GPU(s) {why}: {[asdict(g) for g in gpus]}", flush=True)
    reader = GpuReader()
    opened = reader.open()
    idle = reader.read()
    print(f"reader: open {opened or 'ok'}; idle reading {idle}", flush=True)
    lasting = str(args.seconds + 60)
    task = subprocess.Popen([sys.executable, "-c", LOAD, lasting])
    other = subprocess.Popen([sys.executable, "-c", LOAD, lasting])
    readings: list[list[dict]] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not {task.pid, other.pid} <= listed_pids(reader.read()):
            if task.poll() is not None or other.poll() is not None:
                break  # a load could not start (no CUDA, no torch): the checks below say so
            time.sleep(0.5)
        started = time.monotonic()
        while time.monotonic() - started < args.seconds:
            readings.append(reader.read())
            time.sleep(0.5)
    finally:
        for proc in (task, other):
            proc.kill()
            proc.wait()
        reader.close()
    both = [r for r in readings if {task.pid, other.pid} <= listed_pids(r)]
    record = {
        "facts": [asdict(g) for g in gpus],
        "facts_reason": why,
        "idle": idle,
        "task_pid": task.pid,
        "other_pid": other.pid,
        "readings": readings,
    }
    args.out.write_text(json.dumps(record, indent=1))
    checks = {
        "facts found a GPU": bool(gpus),
        "reader opened": opened == "",
        "every reading listed both processes by their pids": bool(readings) and len(both) == len(readings),
        "utilization read under load": any(isinstance(g.get("utilization_percent"), float) for r in both for g in r),
    }
    for what, ok in checks.items():
        print(f"{'ok ' if ok else 'FAILED'} {what}")
    print(f"{len(readings)} readings, {len(both)} listing both; last: {readings[-1] if readings else None}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
