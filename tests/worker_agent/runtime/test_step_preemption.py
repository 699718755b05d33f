"""A MultiWorkerMirrored gang stopped mid-epoch by SIGTERM (what the agent sends when a job is preempted) saves at its
next step and goes on from the step after it: real TF processes, two workers on loopback, tf_keras; for the builtin
program and for a user's unmodified `model.fit` script with its own `BackupAndRestore` (through the injected hook).

TensorFlow's PreemptionCheckpointHandler (switched on off GCP by worker_agent/runtime/preemption.py) saves at a step
end every worker agrees on and exits 42; the task's log then says which step that was (the last one it began), and
the restarted gang's facts say where it went on: the next step, in the same epoch. Nothing of the agent runs here;
the agent's side (SIGTERM, the grace, SIGKILL) is tests/orchestrator/test_step_preemption_e2e.py's.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import ROOT, wait_until
from tests.worker_agent.runtime._tasks import PYTHON, Task, describe, task_env, tasks, tf_config, wait_all
from tests.worker_agent.runtime.test_builtin_programs import RUN_TIMEOUT_S, mwms_cluster, start_mwms

STEPS = 150  # long epochs (a few seconds on 2 cores), so a SIGTERM sent early in epoch 2 lands inside it
SAVED = re.compile(r"stopped by SIGTERM: saved a backup after epoch (\d+), step (\d+) \(its last completed\)")
USER_SCRIPT = ROOT / "tests" / "programs" / "mwms_backup_fit.py"


def start_builtin(start: Any, job: Path, cwd: Path, label: str) -> list[Task]:
    return start_mwms(start, job, {"epochs": 3, "steps_per_epoch": STEPS}, cwd, label=label)


def start_user_script(start: Any, job: Path, cwd: Path, label: str) -> list[Task]:
    cluster = mwms_cluster()
    argv = [PYTHON, "-u", str(USER_SCRIPT), "--epochs", "3", "--steps", str(STEPS)]
    return [
        start(f"{label}worker-{i}", argv, task_env(job, TF_CONFIG=tf_config(cluster, "worker", i)), cwd)
        for i in range(2)
    ]


def training_lines(task: Task) -> list[dict[str, Any]]:
    """The metrics callback's train lines (not the process's CPU-share lines, which carry no epoch)."""
    return [line for line in task.of_kind("metric", "train") if "loss" in line["metrics"]]


def saved_at(task: Task) -> tuple[int, int]:
    """The (epoch, step) the task saved at its stop, both counted from 1, as its output says."""
    found = SAVED.findall(task.output())
    assert len(found) == 1, f"{task.name} did not say where it saved:\n{task.output()[-3000:]}"
    return int(found[0][0]), int(found[0][1])


@pytest.mark.parametrize("program", [start_builtin, start_user_script], ids=["builtin", "user_fit_script"])
def test_a_gang_stopped_by_sigterm_mid_epoch_resumes_at_the_step_after_its_last_completed_one(
    tmp_path: Path, program: Callable[[Any, Path, Path, str], list[Task]]
) -> None:
    job = tmp_path / "job"
    with tasks() as start:
        first = program(start, job, tmp_path, "run1-")
        wait_until(
            lambda: (
                any(line["epoch"] >= 2 for line in training_lines(first[0]))
                or any(w.proc.poll() is not None for w in first)
            ),
            RUN_TIMEOUT_S,
            what="worker 0 to report a step of epoch 2",
        )
        for worker in first:
            os.killpg(worker.proc.pid, signal.SIGTERM)  # each agent signals its own task's process group
        codes = wait_all(first, RUN_TIMEOUT_S)
        assert set(codes.values()) == {42}, describe(first)  # TensorFlow's exit after its save, not SIGKILL's -9

        saved = {saved_at(w) for w in first}
        assert len(saved) == 1, saved  # every worker saved at the same step
        ((epoch, step),) = saved
        assert (epoch, 1 <= step < STEPS) == (2, True), describe(first)  # mid-epoch 2
        reported = max(line["step"] for line in training_lines(first[0]))
        assert reported <= (epoch - 1) * STEPS + step  # nothing the first run reported is lost

        second = program(start, job, tmp_path, "run2-")
        codes = wait_all(second, RUN_TIMEOUT_S)
        assert set(codes.values()) == {0}, describe(second)

    for worker in second:
        facts = worker.facts()
        # Epochs and steps done before this run: the saved step's epoch, and every step of it up to the saved one.
        assert (facts["resumed_from_epoch"], facts["resumed_from_step"]) == (epoch - 1, step), describe(second)
        assert [e["epoch"] for e in worker.epoch_ends()] == [2, 3]
        assert worker.epoch_ends()[0]["step"] == 2 * STEPS  # the resumed epoch ends on the same global step
        steps = [line["step"] for line in training_lines(worker)]
        assert all(type(s) is int for s in steps) and min(steps) > (epoch - 1) * STEPS + step, steps
    first_loss = first[0].epoch_ends()[0]["metrics"]["loss"]
    resumed_loss = second[0].epoch_ends()[0]["metrics"]["loss"]
    assert resumed_loss < first_loss, (first_loss, resumed_loss)  # the weights came back, not only the counters
    assert second[0].facts()["saves_at_stop"] is True  # the scheduler counts no work at risk for it
    if program is start_builtin:
        assert f"resumed from epoch {epoch - 1}, step {step}" in second[0].output()
