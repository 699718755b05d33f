"""Running a helper command (a probe, a venv build) as an unprivileged task uid, from a fixed environment: never the
user's, never a shell string, cwd /, no stdin, with a deadline and a bounded output.

Which uid: the last of the agent's task uid range (`--task-uids A-B`: B), the one a job gets last (the control plane
hands out the lowest free slot first); held with the machine-wide shared lock a job holds on its uid, so no agent
empties the uid under the helper. Without task uids (the agent not root), the agent's own user runs it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from worker_agent.supervision import reaping
from worker_agent.supervision.identity import UidRange
from worker_agent.supervision.launch import inherited_env

MAX_OUTPUT = 1024 * 1024


@dataclass(frozen=True)
class Helper:
    """Who helper commands run as: `uid` None is the agent's own user."""

    uid: int | None = None

    @classmethod
    def of(cls, uids: UidRange | None) -> Helper:
        return cls(None if uids is None else uids.high)

    @contextlib.contextmanager
    def held(self) -> Iterator[dict[str, object]]:
        """Popen's keyword arguments for running as this helper, while its uid's lock is held."""
        if self.uid is None:
            yield {}
            return
        lock = reaping.UidLock.shared(self.uid)
        try:
            yield {"user": self.uid, "group": self.uid, "extra_groups": [], "umask": 0o022}
        finally:
            lock.close()

    def chown(self, path: Path) -> None:
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)


def fixed_env(workdir: Path, **extra: str) -> dict[str, str]:
    """The agent's own allowed variables (what a task inherits from it: PATH, LD_LIBRARY_PATH, CUDA_*, ...; never a
    job's), without PYTHONPATH, plus `extra`."""
    env = inherited_env(workdir)
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


@dataclass(frozen=True)
class Ran:
    returncode: int | None  # None: killed at its deadline
    stdout: str
    stderr: str


def run(helper: Helper, argv: Sequence[str], env: dict[str, str], timeout_s: float) -> Ran:
    """Run `argv` as the helper and wait (at most `timeout_s`, then SIGKILL); its output cut to MAX_OUTPUT each."""
    with helper.held() as as_user:
        try:
            proc = subprocess.Popen(
                list(argv), env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, **as_user,  # type: ignore[call-overload]
            )  # fmt: skip
        except OSError as exc:
            return Ran(127, "", f"could not start {argv[0]}: {exc}")
        try:
            out, err = proc.communicate(timeout=timeout_s)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            out, err = proc.communicate()
            code = None
    return Ran(code, out[-MAX_OUTPUT:].decode(errors="replace"), err[-MAX_OUTPUT:].decode(errors="replace"))
