"""The chaos soak, 75 seconds of it: `bench/chaos.py` on a stack of its own (embedded PostgreSQL and Redis, web,
orchestrator, ingest, three agents), its parts SIGKILLed every few seconds (about as many faults as two minutes with
one every 5 s gave: 15 to 20), then every invariant checked.

The seed fixes which parts are killed and which jobs run; when they die relative to what the stack is doing varies
from run to run, which is the point. Every invariant must hold whatever the timing.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT, ManagedProcess, own_stack_env


@pytest.mark.timeout(900)  # the soak, then every job must end: more than the suite's 300 s per test
def test_a_soak_of_faults_loses_nothing_and_leaves_nothing_behind(tmp_path, artifacts_dir):
    results_file = tmp_path / "chaos.json"
    env = own_stack_env()
    soak = ManagedProcess(
        "chaos",
        [sys.executable, "bench/chaos.py", "--minutes", "1.25", "--fault-every", "3", "--seed", "11",
         "--settle", "300", "--json", str(results_file)],
        env,
        cwd=ROOT,
    )  # fmt: skip
    try:
        code = soak.proc.wait(timeout=720)
    finally:
        soak.stop()
        (artifacts_dir / "chaos.log").write_text(soak.output())
    assert results_file.exists(), soak.output()[-4000:]
    results = json.loads(results_file.read_text())
    if results["failed"]:  # the soak kept its folder: every part's log goes with the suite's artifacts
        kept = re.search(r"\[chaos\] kept (\S+)", soak.output())
        if kept:
            shutil.copytree(Path(kept.group(1)) / "log", artifacts_dir / "chaos-logs", dirs_exist_ok=True)
    print(soak.output()[-2500:])
    assert results["failed"] == [], soak.output()[-4000:]
    assert {"events lost", "log lines lost", "points lost", "stuck tasks", "orphans"} <= set(results["invariants"])
    assert code == 0
    assert sum(results["faults"].values()) >= 10
    assert len(results["faults"]) >= 4  # several kinds of part were killed, not one over and over
    assert results["jobs succeeded"] > 0 and results["tasks checked"] > 0
