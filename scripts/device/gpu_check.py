"""The checks of scripts/device/gpu_check.sh (run that): NVML reader vs nvidia-smi, the probe and gpu_reason for each
Python given, and a MirroredStrategy job over every GPU when one of them has a TensorFlow that sees them.

    python scripts/device/gpu_check.py PYTHON [PYTHON...]     (from the repository root, PYTHONPATH=.)

Exit 0: every check passed; 1: one failed; 77: no GPU here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
QUERY = "index,name,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw,driver_version"
# How far the reader and nvidia-smi may differ: both read NVML, but not at the same instant, and nvidia-smi's memory
# figures leave out the driver's reserved memory that NVML's v1 memory info counts as used.
TOLERANCE = {"memory_total_mb": 0.02, "memory_used_mb": 1024.0, "temperature_c": 3.0, "utilization_percent": 25.0}
POWER_TOLERANCE = (15.0, 0.10)  # watts, or this share of the reading, whichever is larger
PROBE_TIMEOUT_S = 300
JOB_TIMEOUT_S = 420
JOB_CONFIG = {"epochs": 5, "per_replica_batch": 64, "checkpoint": False}
NO_GPU = 77


def main(pythons: list[str]) -> int:
    results: dict[str, Any] = {"pythons": pythons, "failures": []}
    reader_class, how = load_reader()
    results["reader_loaded"] = how or "worker_agent.sampler as installed"
    reader = reader_class()
    why = reader.open()
    if why:
        print(f"gpu_check: {why}")  # "no GPU: ..."
        return NO_GPU
    try:
        smi = nvidia_smi()
        driver = nvml_driver(reader)
        results["driver"] = {"nvml": driver, "nvidia_smi": smi[0]["driver_version"] if smi else ""}
        results["compare_idle"] = compare(reader.read(), smi, results["failures"], "idle")
        if results["driver"]["nvml"] != results["driver"]["nvidia_smi"]:
            results["failures"].append(f"driver: NVML says {driver}, nvidia-smi {results['driver']['nvidia_smi']}")
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
            workdir = Path(scratch) / "agent"
            pythonpath = runtime_pythonpath(workdir)
            results["probes"] = [probe(python, pythonpath, reader.count, driver) for python in pythons]
            runner = next((p for p in results["probes"] if p["probe"].get("gpus")), None)
            if runner is None:
                results["job"] = {"skipped": "no Python given has a TensorFlow that sees a GPU"}
            else:
                results["job"] = mirrored_job(runner["python"], pythonpath, Path(scratch), reader, results["failures"])
    finally:
        reader.close()
    summarise(results)
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    return 1 if results["failures"] else 0


# --- the agent's reader -----------------------------------------------------------------------------------------
def load_reader() -> tuple[type, str]:
    """worker_agent.sampler.GpuReader, unchanged. Where this Python cannot import the wire modules the sampler also
    imports (contracts.protocol needs cryptography, which a GPU image's own Python may lack), those two are stood in
    for by the few names the sampler takes from them: the reader itself needs only NVML."""
    try:
        from worker_agent.sampler import GpuReader

        return GpuReader, ""
    except ImportError as exc:
        missing = str(exc)
    for name in [m for m in sys.modules if m.startswith(("worker_agent.sampler", "contracts."))]:
        del sys.modules[name]
    protocol = types.ModuleType("contracts.protocol")
    protocol.HOST_SAMPLES = "orchestrator.host_samples"  # type: ignore[attr-defined]
    protocol.METRICS_FLUSH_S = 0.2  # type: ignore[attr-defined]
    sys.modules["contracts.protocol"] = protocol
    sys.modules["contracts.broker"] = types.ModuleType("contracts.broker")
    from worker_agent.sampler import GpuReader

    return GpuReader, f"worker_agent.sampler with contracts.protocol/broker stood in for ({missing})"


def nvml_driver(reader: Any) -> str:
    nvml = reader._nvml  # the module the reader opened: the same NVML, already initialised
    try:
        version = nvml.nvmlSystemGetDriverVersion()
    except Exception as exc:
        return f"unreadable: {exc}"
    return version.decode() if isinstance(version, bytes) else str(version)


def nvidia_smi() -> list[dict[str, Any]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    rows = []
    for line in out.strip().splitlines():
        index, name, total, used, util, temp, power, driver = (cell.strip() for cell in line.split(","))
        rows.append(
            {
                "index": int(index),
                "name": name,
                "memory_total_mb": _number(total),
                "memory_used_mb": _number(used),
                "utilization_percent": _number(util),
                "temperature_c": _number(temp),
                "power_w": _number(power),
                "driver_version": driver,
            }
        )
    return rows


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def compare(readings: list[dict[str, Any]], smi: list[dict[str, Any]], failures: list[str], when: str) -> list[dict]:
    """Field by field, GPU by GPU: (reader, nvidia-smi, ok)."""
    if len(readings) != len(smi):
        failures.append(f"{when}: the reader found {len(readings)} GPU(s), nvidia-smi {len(smi)}")
    rows = []
    for ours, theirs in zip(readings, smi, strict=False):  # a count mismatch is already a failure
        row: dict[str, Any] = {"index": ours["index"]}
        row["name"] = (ours["name"], theirs["name"], ours["name"] == theirs["name"])
        for field in ("memory_total_mb", "memory_used_mb", "temperature_c", "utilization_percent", "power_w"):
            a, b = ours.get(field), theirs.get(field)
            row[field] = (a, b, _close(field, a, b))
        for field, value in row.items():
            if field != "index" and not value[2]:
                failures.append(f"{when}: GPU {ours['index']} {field}: reader {value[0]}, nvidia-smi {value[1]}")
        rows.append(row)
    return rows


def _close(field: str, a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None  # both unreadable is agreement; one side only is not
    a, b = float(a), float(b)
    if field == "power_w":
        watts, share = POWER_TOLERANCE
        return abs(a - b) <= max(watts, share * max(a, b))
    limit = TOLERANCE[field]
    if field == "memory_total_mb":
        return abs(a - b) <= limit * max(a, b)
    return abs(a - b) <= limit


# --- the probe and the reason -------------------------------------------------------------------------------------
def runtime_pythonpath(workdir: Path) -> list[str]:
    """worker_agent/supervision/runtime_root.py, loaded by its path: it is stdlib only, but its package's __init__
    starts the whole supervisor (and the wire modules with it)."""
    spec = importlib.util.spec_from_file_location(
        "tfdash_runtime_root", ROOT / "worker_agent" / "supervision" / "runtime_root.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.runtime_pythonpath(workdir))


def probe(python: str, pythonpath: list[str], gpu_count: int, driver: str) -> dict[str, Any]:
    from worker_agent.environments.gpu_reason import gpu_reason

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [python, "-m", "worker_agent.runtime.probe"],
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
        if not found:
            found = {"error": f"no probe line (rc {done.returncode}): {done.stderr.strip()[-300:]}"}
    except (subprocess.TimeoutExpired, ValueError) as exc:
        found = {"error": f"probe failed: {exc}"}
    return {
        "python": python,
        "probe": found,
        "probe_s": round(time.monotonic() - started, 1),
        "gpu_reason": gpu_reason(gpu_count, driver, found),
    }


# --- the job ------------------------------------------------------------------------------------------------------
def mirrored_job(python: str, pythonpath: list[str], scratch: Path, reader: Any, failures: list[str]) -> dict:
    """digits_mlp under MirroredStrategy over every GPU, the reader sampling twice a second while it runs."""
    job_dir = scratch / "job"
    job_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "TF_CONFIG")}
    read_fd, write_fd = os.pipe()
    env.update(
        PYTHONPATH=os.pathsep.join(pythonpath),
        PYTHONUNBUFFERED="1",
        TFDASH_JOB_DIR=str(job_dir),
        TFDASH_METRICS_FD=str(write_fd),
        TF_CPP_MIN_LOG_LEVEL="1",
    )
    argv = [python, "-m", "worker_agent.runtime", "--program", "digits_mlp", "--config-json", json.dumps(JOB_CONFIG)]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=scratch,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        pass_fds=(write_fd,),
    )
    os.close(write_fd)
    events: list[dict[str, Any]] = []
    reading = threading.Thread(target=_read_events, args=(read_fd, events), daemon=True)
    reading.start()
    samples: list[list[dict[str, Any]]] = []
    while proc.poll() is None and time.monotonic() - started < JOB_TIMEOUT_S:
        samples.append(reader.read())
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
        failures.append(f"job: still running after {JOB_TIMEOUT_S} s, killed")
    output, _ = proc.communicate()
    reading.join(timeout=10)
    busy = compare(samples[len(samples) // 2], nvidia_smi(), [], "busy") if samples else []
    facts = next((e["facts"] for e in events if e.get("kind") == "facts"), {})
    ends = [e for e in events if e.get("kind") == "metric" and e.get("phase") == "epoch_end"]
    rates = [e["metrics"]["examples_per_s"] for e in events if "examples_per_s" in e.get("metrics", {})]
    seen_pid = any(proc.pid in [p["pid"] for p in gpu.get("processes") or []] for s in samples for gpu in s)
    job = {
        "python": python,
        "rc": proc.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "replicas_in_sync": facts.get("replicas_in_sync"),
        "devices_per_machine": facts.get("devices_per_machine"),
        "tf_version": facts.get("tf_version"),
        "keras": facts.get("keras"),
        "val_accuracy": ends[-1]["metrics"].get("val_accuracy") if ends else None,
        "examples_per_s_median": statistics.median(rates) if rates else None,
        "max_utilization_percent": [
            max((s[i]["utilization_percent"] or 0) for s in samples) for i in range(reader.count)
        ]
        if samples
        else [],
        "max_memory_used_mb": [max((s[i]["memory_used_mb"] or 0) for s in samples) for i in range(reader.count)]
        if samples
        else [],
        "job_pid_seen_by_nvml": seen_pid,
        "compare_busy": busy,
        "output_tail": output[-1500:],
    }
    if proc.returncode != 0:
        failures.append(f"job: exited {proc.returncode}")
    if job["replicas_in_sync"] != reader.count:
        failures.append(f"job: {job['replicas_in_sync']} replicas in sync, {reader.count} GPUs")
    if not seen_pid:
        failures.append("job: NVML never listed the job's process on a GPU")
    if (job["val_accuracy"] or 0) < 0.9:
        failures.append(f"job: validation accuracy {job['val_accuracy']}")
    return job


def _read_events(fd: int, into: list[dict[str, Any]]) -> None:
    with os.fdopen(fd) as pipe:
        for line in pipe:
            try:
                into.append(json.loads(line))
            except ValueError:
                continue


# --- the summary --------------------------------------------------------------------------------------------------
def summarise(results: dict[str, Any]) -> None:
    print(f"gpu_check: reader: {results['reader_loaded']}")
    print(f"gpu_check: driver: NVML {results['driver']['nvml']}, nvidia-smi {results['driver']['nvidia_smi']}")
    for row in results["compare_idle"]:
        cells = ", ".join(f"{k} {v[0]}/{v[1]}{'' if v[2] else ' DIFFERS'}" for k, v in row.items() if k != "index")
        print(f"gpu_check: GPU {row['index']} (reader/nvidia-smi): {cells}")
    for found in results.get("probes", []):
        p = found["probe"]
        print(
            f"gpu_check: {found['python']}: TensorFlow {p.get('tensorflow') or '-'} ({p.get('keras_flavor') or '-'}),"
            f" CUDA build {p.get('cuda_build') or '-'}, sees {len(p.get('gpus') or [])} GPU(s)"
            f"{', error: ' + p['error'] if p.get('error') else ''}; probe {found['probe_s']} s"
        )
        print(f"gpu_check:   host page reason: {found['gpu_reason'] or '(none: its TensorFlow can use the GPUs)'}")
    job = results.get("job", {})
    if "skipped" in job:
        print(f"gpu_check: MirroredStrategy job skipped: {job['skipped']}")
    elif job:
        print(
            f"gpu_check: MirroredStrategy job: rc {job['rc']} in {job['seconds']} s, TF {job['tf_version']} "
            f"({job['keras']}), {job['replicas_in_sync']} replicas, val_accuracy {job['val_accuracy']}, "
            f"median {job['examples_per_s_median']} examples/s, max util {job['max_utilization_percent']} %, "
            f"max memory {job['max_memory_used_mb']} MiB, pid seen by NVML: {job['job_pid_seen_by_nvml']}"
        )
    for failure in results["failures"]:
        print(f"gpu_check: FAILED {failure}")
    print(f"gpu_check: {'FAILED' if results['failures'] else 'passed'} ({len(results['failures'])} failure(s))")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or [sys.executable]))
