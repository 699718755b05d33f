"""What a task runs: its command line (an uploaded script, cached by content hash, or a built-in program) and its
job folder."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from contracts.protocol import LaunchSpec, ProgramSpec, TaskEventKind
from worker_agent.supervision.launch import Refused

SCRIPT_MODE = 0o444


def argv(program: ProgramSpec, workdir: Path) -> list[str]:
    """The task's command line (never a shell string)."""
    if program.kind == "script":
        return [sys.executable, "-u", str(script_path(program, workdir)), *program.args]
    if program.kind == "builtin":
        if not program.builtin:
            raise Refused(TaskEventKind.LAUNCH_FAILED, "builtin program without a name")
        config = json.dumps(program.builtin_config)
        return [
            sys.executable, "-u", "-m", "worker_agent.runtime",
            "--program", program.builtin, "--config-json", config, *program.args,
        ]  # fmt: skip
    raise Refused(TaskEventKind.LAUNCH_FAILED, f"unknown program kind {program.kind!r}")


def script_path(program: ProgramSpec, workdir: Path) -> Path:
    """The uploaded script, checked against its hash, as a file under the workdir."""
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
    return cache_script(workdir, digest, content)


def cache_script(workdir: Path, digest: str, content: bytes) -> Path:
    """Content-addressed: written once, atomically (temp file + rename), read-only, shared by every task running it."""
    path = workdir / "scripts" / f"{digest}.py"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{digest}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        # Read-only for everyone: tasks under their own uid (--task-uids) run it, none may change it for the others.
        os.chmod(tmp, SCRIPT_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def job_dir(spec: LaunchSpec, workdir: Path) -> Path:
    """Where the task keeps checkpoints and artifacts: the spec's folder, or one per job under the workdir."""
    if spec.job_dir:
        return Path(spec.job_dir)
    return workdir / "jobs" / str(spec.job_id) / "shared"
