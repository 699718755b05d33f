"""Running a failing script of tests/programs/failing/ for real, once, and turning what it left (its exit status and
its last output lines) into the task the classifier sees."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orchestrator.diagnosis.classify import TaskEnd
from orchestrator.diagnosis.store import TAIL_LINES

FAILING = Path(__file__).resolve().parents[2] / "programs" / "failing"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def run(script: str, cwd: Path, *, env: Mapping[str, str] | None = None, timeout: float = 120) -> tuple[int, list[str]]:
    """Its exit status and its output lines, stderr's last (the tail the product keeps is stderr's, where a traceback
    goes)."""
    done = subprocess.run(
        [sys.executable, str(FAILING / script)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    return done.returncode, (done.stderr.splitlines() or done.stdout.splitlines())[-TAIL_LINES:]


def task_end(code: int, lines: list[str], *, label: str = "worker 0 on host-a", index: int = 0, state: str = "failed",
             after_s: float = 0, task_type: str = "worker", detail: str = "") -> TaskEnd:  # fmt: skip
    return TaskEnd(
        label=label, id=100 + index, type=task_type, index=index, state=state, exit_code=code, detail=detail,
        finished_at=T0 + timedelta(seconds=after_s), lines=tuple(lines), host=label.rpartition(" on ")[2],
    )  # fmt: skip
