"""Real TF task processes for the runtime tests: each gets its own metrics pipe, as the agent will give it.

A task is started the way the supervisor starts one (own process group, hooks/ first on PYTHONPATH, the package root
last) but by hand, with a hand-written TF_CONFIG; nothing of the agent or the orchestrator runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from tests.support.processes import ROOT, wait_until

HOOKS = ROOT / "worker_agent" / "hooks"
PYTHON = sys.executable


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def task_env(job_dir: Path, *, legacy: bool = True, logical_cpus: int = 1, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFDASH_", "TF_CONFIG"))}
    env.update(
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(HOOKS), str(ROOT)]),
        TFDASH_JOB_DIR=str(job_dir),
        TFDASH_LOGICAL_CPU_DEVICES=str(logical_cpus),
        GRPC_FAIL_FAST="use_caller",
        TF_CPP_MIN_LOG_LEVEL="2",  # keep the captured output to what the tests read
        CUDA_VISIBLE_DEVICES="",
    )
    env.pop("TF_USE_LEGACY_KERAS", None)
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    env.update(extra)
    return env


class Task:
    """One process with stdout+stderr captured and a metrics pipe whose JSON lines are collected."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], cwd: Path, metrics: bool = True) -> None:
        self.name = name
        self.lines: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.bad_lines: list[str] = []
        self._lock = threading.Lock()
        env = dict(env)
        read_fd = write_fd = -1
        if metrics:
            read_fd, write_fd = os.pipe()
            env["TFDASH_METRICS_FD"] = str(write_fd)
        try:
            self.proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                start_new_session=True,
                pass_fds=(write_fd,) if metrics else (),
            )
        finally:
            if metrics:
                os.close(write_fd)  # the child holds the only write end: EOF once it exits
        self._readers = [threading.Thread(target=self._read_output, daemon=True)]
        if metrics:
            self._readers.append(threading.Thread(target=self._read_metrics, args=(read_fd,), daemon=True))
        for reader in self._readers:
            reader.start()

    def _read_output(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def _read_metrics(self, fd: int) -> None:
        with os.fdopen(fd, "r", encoding="utf-8") as pipe:
            for line in pipe:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    with self._lock:
                        self.bad_lines.append(line)
                    continue
                with self._lock:
                    self.events.append(event)

    # --- reading ------------------------------------------------------------------------------------------------
    def output(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def of_kind(self, kind: str, phase: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("kind") == kind and (phase is None or e.get("phase") == phase)]

    def facts(self) -> dict[str, Any]:
        found = self.of_kind("facts")
        assert found, f"{self.name} wrote no facts line:\n{self.output()[-3000:]}"
        return found[-1]["facts"]

    def epoch_ends(self) -> list[dict[str, Any]]:
        return self.of_kind("metric", "epoch_end")

    # --- lifecycle ----------------------------------------------------------------------------------------------
    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} still running after {timeout} s:\n{self.output()[-4000:]}") from None
        for reader in self._readers:
            reader.join(timeout=10)
        return code

    def kill(self) -> None:
        """SIGKILL the process group, as a crash or the agent's kill does (TF ignores SIGTERM)."""
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=15)
        for reader in self._readers:
            reader.join(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()


def runtime_argv(program: str, config: dict[str, Any]) -> list[str]:
    return [PYTHON, "-u", "-m", "worker_agent.runtime", "--program", program, "--config-json", json.dumps(config)]


@contextmanager
def tasks() -> Iterator[Callable[..., Task]]:
    """Start tasks through the yielded function; every one is killed (process group) on the way out."""
    started: list[Task] = []

    def start(name: str, argv: Sequence[str], env: dict[str, str], cwd: Path, metrics: bool = True) -> Task:
        task = Task(name, argv, env, cwd, metrics)
        started.append(task)
        return task

    try:
        yield start
    finally:
        for task in started:
            task.stop()


def wait_all(group: Sequence[Task], timeout: float) -> dict[str, int]:
    """Wait for every task of `group` to exit (a failing one does not stop the wait for the rest)."""
    try:
        wait_until(lambda: all(t.proc.poll() is not None for t in group), timeout, interval=0.2, what="every exit")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(group)}") from None
    return {t.name: t.wait(10) for t in group}


def describe(group: Sequence[Task]) -> str:
    return "\n".join(f"--- {t.name} (rc {t.proc.poll()}) ---\n{t.output()[-2500:]}" for t in group)
