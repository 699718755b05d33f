"""Is it input-bound? The runtime's waiting share per script beside the TF profiler's own figure for the same run.

Runs each script of tests/programs/input_bound/ (sleepy_map: a map that sleeps via tf.py_function; prefetched_
parallel_map: the same map with 16 parallel calls and prefetch; cached_compute: a compute-heavy model on a cached
dataset), unmodified, once per seed, the way the agent runs a task: worker_agent/hooks first on PYTHONPATH and
a metrics pipe named by TFDASH_METRICS_FD, so the injected callback measures `input_wait_fraction` per train window.
The same process runs under TensorFlow's profiler (tf.profiler.experimental.start before the script, stop after),
and its trace gives the profiler's figure for that very run.

The profiler's figure, computed from the trace here (tensorboard_plugin_profile, which turns a trace into its
input-pipeline page, is not installed and nothing is downloaded): the run's host plane (`/host:CPU` of the
`.xplane.pb`, parsed with the XSpace protobuf TensorFlow ships) holds one `train` event per fit step (the
step marker tf_keras's fit opens around each step) and one `IteratorGetNextOp::DoCompute` event per batch fetched. As
TensorFlow's profiler classifies host events (event_span.cc: a host event named IteratorGetNext* is "host wait
input"), a step's input time is the time of such events inside that step's marker; the figure is their sum over the
sum of the steps' times. The first step of each run (tracing) is left out on both sides.

The runtime's figure: the mean of the run's windows' `input_wait_fraction` (what orchestrator/insights/input_bound.py
judges, over a worker's last 10) and, beside it, their median and their mean weighted by window length. Verdicts use
TF's thresholds (>= 20 % highly, >= 5 % moderately). Expected: highly / moderately or not / not.

    .venv/bin/python bench/input_bound.py [--seeds 3] [--batches 20] [--epochs 2] [--scripts sleepy_map,...]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROGRAMS = ROOT / "tests" / "programs" / "input_bound"
SCRIPTS = ("sleepy_map", "prefetched_parallel_map", "cached_compute")
EXPECTED = {"sleepy_map": ("highly",), "prefetched_parallel_map": ("moderately", "not"), "cached_compute": ("not",)}
PROFILER_LINE = "tfdash-bench-profiler "
STEP_MARKER = "train"
INPUT_EVENT_PREFIX = "IteratorGetNext"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20, help="batches per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--scripts", default=",".join(SCRIPTS))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: run this script under the profiler
    args = parser.parse_args()
    if args.child:
        return child(Path(args.child))

    from orchestrator.insights.input_bound import judge_worker, level  # plain Python: no Django query is made

    print(f"batches/epoch={args.batches} epochs={args.epochs} seeds={args.seeds}")
    print(f"{'script':26s} {'seed':>4s} {'runtime median':>14s} {'time-weighted':>13s} {'TF profiler':>11s}  verdict")
    failures = 0
    for name in args.scripts.split(","):
        for seed in range(args.seeds):
            run = run_script(name, seed, args)
            judged = judge_worker(run["shares"])  # its last 10 windows, as the insight judges a worker
            agrees = level(run["profiler"]) if run["profiler"] is not None else "?"
            print(
                f"{name:26s} {seed:4d} {fmt(run['median']):>14s} {fmt(run['mean']):>13s} {fmt(run['profiler']):>11s}"
                f"  {judged.level}: {fmt(judged.share)} of the last {judged.windows} windows (profiler: {agrees}; "
                f"{run['steps']} profiled steps)"
            )
            if judged.level not in EXPECTED.get(name, (judged.level,)):
                failures += 1
    print(f"verdicts as expected: {'yes' if failures == 0 else f'no, {failures} runs differ'}")
    return 1 if failures else 0


def fmt(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def run_script(name: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    read_fd, write_fd = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFDASH_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT / "worker_agent" / "hooks"), str(ROOT)]),
        TFDASH_METRICS_FD=str(write_fd),
        TF_USE_LEGACY_KERAS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        CUDA_VISIBLE_DEVICES="",
        INPUT_BOUND_SEED=str(seed),
        INPUT_BOUND_BATCHES=str(args.batches),
        INPUT_BOUND_EPOCHS=str(args.epochs),
    )
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", str(PROGRAMS / f"{name}.py")]
    proc = subprocess.Popen(
        argv, env=env, pass_fds=(write_fd,), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    os.close(write_fd)
    events: list[dict[str, Any]] = []

    def drain() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for line in pipe:
                with contextlib.suppress(ValueError):  # a line cut by a killed run
                    events.append(json.loads(line))

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        output, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    reader.join(timeout=10)
    if proc.returncode != 0:
        raise SystemExit(f"{name} (seed {seed}) failed with {proc.returncode}:\n{output[-4000:]}")
    profiled = next((json.loads(line[len(PROFILER_LINE) :]) for line in output.splitlines() if line.startswith(
        PROFILER_LINE)), {})  # fmt: skip
    shares, weights, previous = [], [], 0
    for event in events:
        if event.get("kind") != "metric" or event.get("phase") != "train":
            continue
        values, steps = event["metrics"], event["step"] - previous
        previous = event["step"]
        if "input_wait_fraction" in values:
            shares.append(values["input_wait_fraction"])
            weights.append(steps * values["step_time_s"])  # the window's seconds
    mean = sum(s * w for s, w in zip(shares, weights, strict=True)) / sum(weights) if sum(weights) > 0 else None
    median = statistics.median(shares) if shares else None
    return {
        "shares": shares,
        "median": median,
        "mean": mean,
        "profiler": profiled.get("share"),
        "steps": profiled.get("steps", 0),
    }


# --- the child: the script under TensorFlow's profiler --------------------------------------------------------------
def child(script: Path) -> int:
    import tensorflow as tf

    logdir = tempfile.mkdtemp(prefix="tfdash-input-bound-")
    options = tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=3, python_tracer_level=0, device_tracer_level=0
    )
    tf.profiler.experimental.start(logdir, options=options)
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        tf.profiler.experimental.stop()
    traces = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))
    share, steps = profiler_share(Path(traces[-1])) if traces else (None, 0)
    print(PROFILER_LINE + json.dumps({"share": share, "steps": steps}), flush=True)
    return 0


def profiler_share(trace: Path) -> tuple[float | None, int]:
    """Input time / step time over the run's `train` step markers, the first one (tracing) left out."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(trace.read_bytes())
    host = next((plane for plane in space.planes if plane.name == "/host:CPU"), None)
    if host is None:
        return None, 0
    steps: list[tuple[int, int]] = []
    fetches: list[tuple[int, int]] = []
    for line in host.lines:
        for event in line.events:
            name = host.event_metadata[event.metadata_id].name
            start = line.timestamp_ns * 1000 + event.offset_ps
            if name == STEP_MARKER:
                steps.append((start, start + event.duration_ps))
            elif name.startswith(INPUT_EVENT_PREFIX):
                fetches.append((start, start + event.duration_ps))
    steps.sort()
    steps = steps[1:]
    total = sum(end - start for start, end in steps)
    if total <= 0:
        return None, len(steps)
    waited = sum(max(0, min(end, f_end) - max(start, f_start)) for start, end in steps for f_start, f_end in fetches)
    return waited / total, len(steps)


if __name__ == "__main__":
    sys.exit(main())
