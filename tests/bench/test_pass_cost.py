"""bench/pass_cost.py, small, in the suite: scheduler passes in-process on a stack of its own (embedded PostgreSQL and
Redis), first over an idle fleet and a full queue, then one pass after each gang that ends on the busy fleet. Checks
the rows the passes wrote, never speed: no port or device held twice on a host, every job placed once with all its
tasks."""

from __future__ import annotations

import re
import sys

import pytest

from tests.support.processes import ROOT, ManagedProcess, own_stack_env


@pytest.mark.timeout(300)
def test_passes_on_a_busy_fleet_book_nothing_twice(artifacts_dir):
    env = own_stack_env()
    bench = ManagedProcess(
        "pass-cost",
        [sys.executable, "bench/pass_cost.py", "--hosts", "20", "--jobs", "60", "--ends", "15"],
        env,
        cwd=ROOT,
    )
    try:
        code = bench.proc.wait(timeout=240)
    finally:
        bench.stop()
        (artifacts_dir / "pass-cost.log").write_text(bench.output())
    output = bench.output()
    assert code == 0, output[-4000:]
    assert "[pass-cost] failures: none" in output
    first = re.search(r"first pass .* tasks\s+(\d+)", output)
    steady = re.search(r"steady .* tasks\s+(\d+)", output)
    assert first and int(first.group(1)) > 0, output[-4000:]  # the idle fleet takes the head of the queue at once
    assert steady and int(steady.group(1)) > 0, output[-4000:]  # and ended gangs make room for more
