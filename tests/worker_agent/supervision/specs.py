"""Launch specs shared by the supervision and agent-app tests."""

from __future__ import annotations

import base64
import hashlib
import itertools
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

from contracts.protocol import (
    LaunchSpec,
    ProgramSpec,
)

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
_task_ids = itertools.count(1000)


def program(name: str) -> ProgramSpec:
    content = (PROGRAMS / name).read_bytes()
    return ProgramSpec(
        kind="script",
        script_b64=base64.b64encode(content).decode(),
        script_sha256=hashlib.sha256(content).hexdigest(),
    )


def spec_for(name: str, *args: str, **changes: Any) -> LaunchSpec:
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
        program=replace(program(name), args=list(args)),
        kill_grace_s=1.0,
    )
    return replace(spec, **changes)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
