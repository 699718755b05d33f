"""bench/usage_query.py, tiny, in the suite: the usage reads on a stack of its own (embedded PostgreSQL and Redis),
filled with a few thousand tasks instead of a million. Checks that it runs and that its own checks pass (the rollup
holds the tasks' device-seconds, running tasks are found through their partial index and counted), never speed."""

from __future__ import annotations

import sys

import pytest

from tests.support.processes import ROOT, ManagedProcess, own_stack_env


@pytest.mark.timeout(300)
def test_the_usage_bench_reads_what_the_tasks_held(artifacts_dir):
    argv = [
        "bench/usage_query.py",
        "--tasks",
        "4000",
        "--users",
        "20",
        "--groups",
        "4",
        "--running",
        "10",
        "--runs",
        "2",
    ]
    bench = ManagedProcess("usage-query", [sys.executable, *argv], own_stack_env(), cwd=ROOT)
    try:
        code = bench.proc.wait(timeout=240)
    finally:
        bench.stop()
        (artifacts_dir / "usage-query.log").write_text(bench.output())
    output = bench.output()
    assert code == 0, output[-4000:]
    assert "per user per day, 90 days, staff: median" in output and "FAILED" not in output, output[-4000:]
