"""The agent's list of environments and their probes: kept across restarts, each interpreter probed once per file
(a changed file again), an environment reported only once probed, a dropped one forgotten, and a GPU reason when
NVML shows GPUs that the environment's TensorFlow does not (here the real product venv's CPU TensorFlow, probed for
real, with NVML's count given)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from contracts.environments import Environment
from worker_agent.environments.as_task import Helper
from worker_agent.environments.known import Environments


def fake_probe(calls: list[str]) -> Any:
    def probe(environment: Environment, helper: Helper, workdir: Path) -> dict[str, Any]:
        calls.append(environment.interpreter)
        return {"python": "3.11.9", "tensorflow": "2.17.0", "keras": "3.5.0", "gpus": [], "error": ""}

    return probe


def test_it_probes_each_interpreter_once_and_again_when_its_file_changes(tmp_path: Path) -> None:
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    calls: list[str] = []
    envs = Environments(tmp_path / "work", Helper(None), nvml=lambda: (0, ""), probe=fake_probe(calls))
    envs.set([Environment("main", str(python))])
    assert envs.facts() == []  # not probed yet: not reported
    envs.probe_all()
    envs.probe_all()
    assert calls == [str(python)]
    assert [(f.name, f.ok, f.tensorflow) for f in envs.facts()] == [("main", True, "2.17.0")]

    again = Environments(tmp_path / "work", Helper(None), nvml=lambda: (0, ""), probe=fake_probe(calls))
    assert again.interpreter_of("main") == str(python)  # the list survives a restart
    again.probe_all()
    assert calls == [str(python)]  # and so does the probe, for an unchanged file
    os.utime(python, ns=(1, 1))
    again.probe_all()
    assert calls == [str(python)] * 2

    again.set([])
    assert again.facts() == []


def test_a_real_probe_flags_gpus_its_tensorflow_cannot_see(tmp_path: Path) -> None:
    envs = Environments(tmp_path, Helper(None), nvml=lambda: (2, "550.54.15"))
    envs.set([Environment("main", sys.executable), Environment("gone", "/nonexistent/bin/python")])
    envs.probe_all()
    main, gone = envs.facts()
    assert main.ok and main.tensorflow and main.gpus_visible == 0
    assert main.gpu_reason  # 2 GPUs by NVML, none for this CPU build: why, and what to install
    assert not gone.ok and "does not exist on this host" in gone.error
