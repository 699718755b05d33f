"""What a task runs: its command line, its program's files and configuration, and its job folder.

An uploaded script is checked against its hash and written into the task's own folder (0700, owned by the job's uid,
see workspace.py): no other job's uid can read it, nor learn where it is. A builtin program's config goes into its
environment (PROGRAM_CONFIG_ENV: /proc/<pid>/environ is readable by its own uid alone), not onto its command line,
which /proc shows every local user unless /proc hides other uids' processes. A script's arguments stay on its command
line (scripts read sys.argv).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from contracts.task_messages import LaunchSpec, ProgramSpec, TaskEventKind
from contracts.task_wire import PROGRAM_CONFIG_ENV
from worker_agent.supervision.launch import Refused

SCRIPT_MODE = 0o400  # its owner (the job's uid, or the agent's user) reads it; nobody changes it by mistake


@dataclass(frozen=True)
class Program:
    """A checked program: the script's content and file name when it is one."""

    spec: ProgramSpec
    script: bytes | None = None
    # The Python it runs in: the task environment's (or its requirements venv's); "" the agent's own.
    interpreter: str = ""
    # The installations that Python reads (its environment's, and the base a requirements venv's .pth names): a task
    # in a private /tmp must still see them where they lie under /tmp (private_tmp.py binds them back).
    installations: tuple[str, ...] = ()

    @property
    def script_name(self) -> str:
        return f"{self.spec.script_sha256.lower()}.py"

    def argv(self, folder: Path) -> list[str]:
        """The task's command line (never a shell string); a script is at `folder / script_name`."""
        python = self.interpreter or sys.executable
        if self.script is not None:
            return [python, "-u", str(folder / self.script_name), *self.spec.args]
        return [python, "-u", "-m", "worker_agent.runtime", "--program", self.spec.builtin, *self.spec.args]

    def env(self) -> dict[str, str]:
        if self.script is not None:
            return {}
        return {PROGRAM_CONFIG_ENV: json.dumps(self.spec.builtin_config)}


def load(program: ProgramSpec) -> Program:
    """The program checked (a script against its hash); raises Refused with the reason."""
    if program.kind == "script":
        return Program(program, _script(program))
    if program.kind == "builtin":
        if not program.builtin or not isinstance(program.builtin, str):
            raise Refused(TaskEventKind.LAUNCH_FAILED, "builtin program without a name")
        if not isinstance(program.builtin_config, dict):
            raise Refused(TaskEventKind.LAUNCH_FAILED, "a builtin program's config must be a JSON object")
        return Program(program)
    raise Refused(TaskEventKind.LAUNCH_FAILED, f"unknown program kind {program.kind!r}")


def _script(program: ProgramSpec) -> bytes:
    try:
        content = base64.b64decode(program.script_b64, validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise Refused(TaskEventKind.LAUNCH_FAILED, f"script content is not valid base64: {exc}") from None
    digest = hashlib.sha256(content).hexdigest()
    if not isinstance(program.script_sha256, str) or digest != program.script_sha256.lower():
        raise Refused(
            TaskEventKind.LAUNCH_FAILED,
            f"script sha256 mismatch: expected {program.script_sha256!r}, content has {digest}",
        )
    return content


class VenvBuilder(Protocol):
    """Builds a job's requirements venv on top of a base interpreter (worker_agent/environments/venvs.py)."""

    def python(self, base: str, requirements: str) -> str: ...

    def ensure(self, base: str, requirements: str, log_fd: int | None = None) -> tuple[str, bool]: ...


def interpreter_for(spec: LaunchSpec, venvs: VenvBuilder | None) -> tuple[str, str]:
    """(the task environment's interpreter, the one the task runs: its requirements venv's when it has one). A spec
    naming an environment without its interpreter (deleted since the job was placed) is refused: running the task in
    the agent's own interpreter instead would be a silent lie."""
    if spec.environment and not spec.interpreter:
        gone = f"the job's environment {spec.environment} is no longer registered on its cluster"
        raise Refused(TaskEventKind.LAUNCH_FAILED, gone)
    base = spec.interpreter or sys.executable
    if not spec.requirements:
        return base, spec.interpreter
    if venvs is None:
        raise Refused(TaskEventKind.LAUNCH_FAILED, "this agent builds no requirements venvs")
    return base, venvs.python(base, spec.requirements)


def installations(*interpreters: str) -> tuple[str, ...]:
    """The installation folders of these interpreters (a venv's root, and where its link leads): what a task started
    with one of them reads besides the interpreter itself (its site-packages, its standard library)."""
    found: list[str] = []
    for interpreter in filter(None, interpreters):
        for path in (Path(interpreter), Path(os.path.realpath(interpreter))):
            prefix = str(path.parent.parent)
            if prefix not in found:
                found.append(prefix)
    return tuple(found)


def job_dir(spec: LaunchSpec, workdir: Path) -> Path:
    """Where the task keeps checkpoints and artifacts: the spec's folder (it must lie under the agent's roots: the
    workspace refuses any other), or one per job under the workdir."""
    if spec.job_dir:
        return Path(spec.job_dir)
    return workdir / "jobs" / str(spec.job_id) / "shared"
