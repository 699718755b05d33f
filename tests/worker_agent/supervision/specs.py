"""Launch specs shared by the supervision and agent-app tests."""

from __future__ import annotations

import base64
import hashlib
import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

from contracts.task_messages import LaunchSpec, ProgramSpec

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
_task_ids = itertools.count(1000)


def script_program(content: bytes, *args: str) -> ProgramSpec:
    return ProgramSpec(
        kind="script",
        script_b64=base64.b64encode(content).decode(),
        script_sha256=hashlib.sha256(content).hexdigest(),
        args=list(args),
    )


def spec_for(name: str, *args: str, **changes: Any) -> LaunchSpec:
    return script_spec((PROGRAMS / name).read_bytes(), *args, **changes)


def script_spec(content: bytes, *args: str, **changes: Any) -> LaunchSpec:
    """A task of job 7 running the script `content` with `args`; `changes` replace any other field."""
    spec = LaunchSpec(
        job_id=7,
        task_id=next(_task_ids),
        attempt=0,
        task_type="worker",
        task_index=0,
        port=None,
        devices=[0],
        gpu=False,
        env={},
        program=script_program(content, *args),
        kill_grace_s=1.0,
    )
    return replace(spec, **changes)
