"""The benches without a test of their own, each in its smallest mode, so none stops starting unnoticed (bench/
page_load.py once died on a missing control-plane key). Correctness only, never speed: bench/pipeline.py delivers
every point to its viewers and stores each once; bench/page_load.py draws the chart; bench/overhead.py trains with
and without the metrics callback. Each uses a database of its own (TFDASH_BENCH_DATABASE) on the suite's servers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT, ManagedProcess, own_stack_env


def run(name: str, argv: list[str], artifacts_dir: Path, timeout: float, **extra_env: str) -> tuple[int, str]:
    env = {**own_stack_env(), **extra_env}
    env["TFDASH_BENCH_DATABASE"] = f"{os.environ.get('TEST_DATABASE_NAME', 'test_tfdash')}_{name}"
    # The suite's own servers (embedded ones where this machine runs none), each bench in a database of its own.
    env["TFDASH_BENCH_POSTGRES"] = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
    env["TFDASH_BENCH_REDIS"] = os.environ["REDIS_URL"].rsplit("/", 1)[0]
    bench = ManagedProcess(name, [sys.executable, *argv], env, cwd=ROOT)
    try:
        code = bench.proc.wait(timeout=timeout)
    finally:
        bench.stop()
        (artifacts_dir / f"{name}.log").write_text(bench.output())
    return code, bench.output()


@pytest.mark.timeout(300)
def test_pipeline_bench_delivers_and_stores_every_point_once(artifacts_dir):
    code, output = run("pipeline", ["bench/pipeline.py", "--jobs", "1", "--tasks", "2", "--seconds", "1",
                                    "--crowd", "2", "--ingest-points", "2000"], artifacts_dir, 240)  # fmt: skip
    assert code == 0, output[-4000:]
    for due, received in re.findall(r"points due to viewers (\d+), received (\d+)", output):
        assert due == received, output[-4000:]
    assert re.search(r"ingest: 2000 points .* stored 2000 .* lost 0, duplicated 0", output), output[-4000:]


@pytest.mark.timeout(300)
def test_page_load_bench_draws_the_long_history(artifacts_dir):
    code, output = run("pageload", ["bench/page_load.py", "--points", "1000", "--loads", "1"], artifacts_dir, 240)
    assert "first chart drawn: median" in output, output[-4000:]
    assert "rolled up 4,002 points" in output, output[-4000:]  # 2 tasks x (2 series x 1,000 and one epoch end)
    assert re.search(r"load 1: first chart drawn at \d+ ms \(\d+ x values drawn", output), output[-4000:]
    assert code in (0, 1), output[-4000:]  # 1: slower than the target, which is the bench's to report, not this test's


@pytest.mark.timeout(300)
def test_overhead_bench_trains_with_and_without_the_callback(artifacts_dir):
    code, output = run("overhead", ["bench/overhead.py", "--rounds", "1", "--epochs", "1", "--examples", "512"],
                       artifacts_dir, 240)  # fmt: skip
    assert code == 0, output[-4000:]


@pytest.mark.timeout(120)
def test_queue_replay_bench_replays_every_policy_and_packing_keeping_its_reservations(artifacts_dir):
    code, output = run("queuereplay", ["bench/queue_replay.py", "--seeds", "5", "--hosts", "20", "--jobs", "60",
                                       "--minutes", "2"], artifacts_dir, 100)  # fmt: skip
    assert code == 0, output[-4000:]  # 1: a reserved job started after its first reservation
    rows = re.findall(r"^5\s+(fifo|backfill|easy)\s+(spread|pack)\s+(\d+)\s", output, re.MULTILINE)
    assert len(rows) == 6, output[-4000:]
    finished = {(policy, packing): int(n) for policy, packing, n in rows}
    assert finished["backfill", "pack"] > finished["fifo", "pack"], output[-4000:]  # a wide head no longer holds all


@pytest.mark.timeout(120)
def test_queue_replay_prices_the_control_planes_latency_in_utilization(artifacts_dir):
    """The same queue replayed with the passes 3 s apart and 2 s from placement to a running process keeps the GPUs
    less busy than the policy alone: the model that prices bench/scale.py's latencies moves the figure it prices."""
    utilization = {}
    for name, lag in (("none", []), ("lagged", ["--interval", "3", "--launch", "2", "--release", "1"])):
        code, output = run(f"queuereplay-{name}", ["bench/queue_replay.py", "--seeds", "5", "--hosts", "20", "--jobs",
                           "60", "--minutes", "2", "--policies", "backfill", "--packings", "pack", *lag],
                           artifacts_dir, 100)  # fmt: skip
        assert code == 0, output[-4000:]
        row = re.search(r"^5\s+backfill\s+pack\s+\d+\s+([0-9.]+)\s", output, re.MULTILINE)
        assert row, output[-4000:]
        utilization[name] = float(row.group(1))
    assert utilization["lagged"] < utilization["none"], utilization


@pytest.mark.timeout(300)
def test_event_cost_bench_drives_every_gang_to_success_through_its_agents_events(artifacts_dir):
    code, output = run("eventcost", ["bench/event_cost.py", "--hosts", "10", "--jobs", "20"], artifacts_dir, 240)
    assert code == 0, output[-4000:]  # 1: a job not succeeded or a task not ended once every event was applied
    assert "[event-cost] failures: none" in output, output[-4000:]
    phases = re.findall(r"^(started|listening|exited)\s+events\s+(\d+)\s+applied\s+(\d+)", output, re.MULTILINE)
    assert [p for p, _n, _a in phases] == ["started", "listening", "exited"], output[-4000:]
    assert all(int(n) > 0 and n == applied for _p, n, applied in phases), output[-4000:]  # each applied once


# The deliveries' deadline in the stall bench's run: shorter than the shipped 10 s (each round waits out the stalls it
# started, twice in a run), long enough that every receiver still holds a delivery when the stalled round starts.
STALL_DEADLINE_S = 5


@pytest.mark.timeout(300)
def test_webhook_stall_bench_runs_both_rounds_and_cuts_every_delivery_at_its_deadline(artifacts_dir):
    code, output = run("webhookstall", ["bench/webhook_stall.py", "--runs", "1", "--jobs", "1"], artifacts_dir, 280,
                       TFDASH_WEBHOOK_DEADLINE_S=str(STALL_DEADLINE_S))  # fmt: skip
    assert re.search(r"run 1: start latency [\d.]+ s quiet, [\d.]+ s stalled; end latency", output), output[-4000:]
    cut = re.search(rf"deliveries cut: (\d+), each held its receiver ([\d.]+)-([\d.]+) s \(deadline "
                    rf"{STALL_DEADLINE_S} s\)", output)  # fmt: skip
    assert cut and int(cut[1]) >= 10 and float(cut[3]) < STALL_DEADLINE_S + 2, output[-4000:]
    assert code in (0, 1), output[-4000:]  # 1: a ratio over the target, the bench's to report (one job is noise)


@pytest.mark.timeout(120)
def test_fair_share_replay_brings_every_account_nearer_its_share_with_memory_than_without(artifacts_dir):
    code, output = run("fairshare", ["bench/fair_share_replay.py", "--seeds", "5", "--hosts", "2", "--days", "4",
                                     "--half-lives", "0,7"], artifacts_dir, 100)  # fmt: skip
    assert code == 0, output[-4000:]
    worst = {float(h): float(miss) for h, miss in re.findall(r"^5\s+(\S+)d\s.*\s([+-]\d+)%\s+[0-9.]+$", output, re.M)}
    assert set(worst) == {0.0, 7.0}, output[-4000:]
    assert abs(worst[7.0]) < abs(worst[0.0]), output[-4000:]


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("gcc") is None, reason="needs valgrind and gcc")
def test_the_instruction_bench_counts_each_fit_on_its_own(tmp_path):
    """bench/overhead_instructions.py's counting, without TensorFlow (its import alone takes minutes under valgrind):
    a program under callgrind dumps its counters between pieces of work through the bench's client library, and the
    bench reads each piece back under its label, the setup's left out. Twice the work counts about twice."""
    from bench.overhead_instructions import build_client, read_dumps

    library = build_client(tmp_path)
    program = (
        "import ctypes, sys; client = ctypes.CDLL(sys.argv[1]); client.tfdash_dump(b'setup')\n"
        "for label, n in ((b'without 0 0', 200_000), (b'with 0 1', 400_000)):\n"
        "    sum(range(n)); client.tfdash_dump(label)\n"
    )
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp_path}/fits", sys.executable, "-c",
                    program, str(library)], check=True, capture_output=True, timeout=150)  # fmt: skip
    counts = dict(read_dumps(tmp_path))
    assert list(counts) == ["without 0 0", "with 0 1"], counts
    assert 1.7 < counts["with 0 1"] / counts["without 0 0"] < 2.3, counts
