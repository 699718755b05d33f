"""bench/input_bound.py in its smallest mode: two of the three scripts, one seed, a few steps, each run under the
hook and TF's profiler, and a row per run with both figures (the runtime's and the profiler's). Correctness of the
bench only; the verdicts on longer runs are tests/worker_agent/runtime/test_input_bound_scripts.py's."""

from __future__ import annotations

import re
import sys

import pytest

from tests.support.processes import ROOT, ManagedProcess, own_stack_env

SHARE = r"(\d+\.\d)%"


@pytest.mark.timeout(240)
def test_input_bound_bench_prints_the_runtimes_share_beside_the_profilers(artifacts_dir) -> None:  # type: ignore[no-untyped-def]
    argv = [sys.executable, "bench/input_bound.py", "--seeds", "1", "--batches", "8", "--epochs", "2",
            "--scripts", "sleepy_map,cached_compute", "--timeout", "180"]  # fmt: skip
    bench = ManagedProcess("input-bound-bench", argv, own_stack_env(), cwd=ROOT)
    try:
        code = bench.proc.wait(timeout=220)
    finally:
        bench.stop()
        (artifacts_dir / "input_bound.log").write_text(bench.output())
    output = bench.output()
    assert code in (0, 1), output[-4000:]  # 1: a verdict other than expected, which is the bench's to report
    for script in ("sleepy_map", "cached_compute"):
        row = re.search(rf"^{script}\s+0\s+{SHARE}\s+{SHARE}\s+{SHARE}\s+\w+: .*\(profiler: \w+;", output, re.M)
        assert row, output[-4000:]
        assert all(0.0 <= float(share) <= 100.0 for share in row.groups())
    assert "verdicts as expected:" in output
