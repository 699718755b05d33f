"""The three input-bound scripts of the issue, unmodified, as the agent runs them (hooks/ on PYTHONPATH, a metrics
pipe): the injected callback's `input_wait_fraction` windows are judged by orchestrator/insights/input_bound.py as
highly (a map that sleeps via tf.py_function), moderately or not (the same map in parallel, prefetched) and not
(a compute-heavy model on a cached dataset) input-bound. Few steps each; bench/input_bound.py runs them longer, with
the TF profiler's own figure beside the runtime's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator.insights.input_bound import MIN_WINDOWS, judge_worker
from tests.support.processes import ROOT
from tests.worker_agent.runtime._tasks import Task, task_env

PROGRAMS = ROOT / "tests" / "programs" / "input_bound"
TF_TIMEOUT_S = 180
MIN_COMPUTE_S = 5.0  # each script's compute in all, its epochs together: about 10 windows of 0.5 s


# Batches and epochs: enough for 10 windows of 0.5 s (a step is 100-300 ms here, the sleepy map's twice that), and at
# least MIN_COMPUTE_S of compute in all wherever steps are faster (on CI's machine under 50 ms: 20 batches made two
# windows in all, too early to judge). The margin is for steps that run faster than the script timed them (timed
# while the other cores were busy): the parallel map's one epoch used to be asked for 2.5 s, 5 windows quiet, and made
# two on CI's others worker on 2026-11-29; a failure now prints the steps and the script's own line. The parallel map
# runs one epoch: a new epoch's iterator waits for its first batch however parallel the map (a step's worth);
# bench/input_bound.py shows two-epoch runs beside the TF profiler's figure.
@pytest.mark.parametrize(
    ("script", "batches", "epochs", "levels"),
    [
        ("sleepy_map", 20, 2, ("highly",)),
        ("prefetched_parallel_map", 40, 1, ("moderately", "not")),
        ("cached_compute", 20, 2, ("not",)),
    ],
)
def test_each_script_is_judged_as_its_pipeline_deserves(
    tmp_path: Path, script: str, batches: int, epochs: int, levels: tuple[str, ...]
) -> None:
    env = task_env(
        tmp_path / "job",
        INPUT_BOUND_BATCHES=str(batches),
        INPUT_BOUND_EPOCHS=str(epochs),
        INPUT_BOUND_MIN_EPOCH_S=str(MIN_COMPUTE_S / epochs),
    )
    task = Task(script, [sys.executable, "-u", str(PROGRAMS / f"{script}.py")], env, cwd=tmp_path)
    code = task.wait(TF_TIMEOUT_S)
    assert code == 0, f"{script} failed ({code}):\n{task.output()[-4000:]}"
    train = task.of_kind("metric", "train")
    shares = [e["metrics"]["input_wait_fraction"] for e in train if "input_wait_fraction" in e["metrics"]]
    assert all(0.0 <= share <= 1.0 for share in shares)
    assert all("step_time_s" in e["metrics"] for e in train)
    judged = judge_worker(shares)
    steps = [round(e["metrics"]["step_time_s"], 4) for e in train]
    assert judged.windows >= MIN_WINDOWS, (
        f"{len(train)} train windows, {len(shares)} with a share, steps of {steps} s; the script said:\n"
        f"{task.output()[-2000:]}"
    )
    assert judged.level in levels, f"{script}: {judged} from {[round(s, 3) for s in shares]}"
    if judged.level != "not":
        assert "prefetch" in judged.fix  # no host samples here: the fix is the pipeline's, not more CPUs
