"""What the agent started, kept on disk, so a restarted agent finds what its previous life left running.

TF processes run in their own session (and ignore SIGTERM), so an agent that is SIGKILLed, or crashes, leaves them
running, holding their ports and devices, with nobody reading their output. The supervisor writes one small JSON file
per task process under `<workdir>/running/` right after the process starts (before STARTED is reported) and removes
it once the task's EXITED has been handed on. A starting agent reads those files before it takes any order
(`reclaim`): a process still alive is an orphan; its metrics pipe ended with the old agent, so it is not adopted:
its process group is killed with SIGKILL, and the task is reported as reclaimed (lost). Its output is not lost: it
went to files (supervision/output.py), which the new agent reads to the end from where the old one had got to.

A pid alone proves nothing after a restart (the kernel reuses pids), so a record also keeps the process's start
time as the OS reports it; a process counts as the task's only when both match.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from worker_agent import atomic

log = logging.getLogger(__name__)

# psutil derives a start time from boot time + clock ticks (1/100 s on Linux): the same process always gives the
# same value; a different process with the same pid cannot have started within the same tick.
START_TIME_TOLERANCE_S = 0.005
KILL_WAIT_S = 10.0
_POLL_S = 0.05


@dataclass(frozen=True)
class ReclaimedTask:
    """A task process the agent's previous life started and this one found on start: killed if it still ran
    (nobody reads its output any more), either way over."""

    job_id: int
    task_id: int
    attempt: int
    pid: int
    detail: str


@dataclass(frozen=True)
class TaskRecord:
    job_id: int
    task_id: int
    attempt: int
    pid: int
    pgid: int  # = pid: every task is started as the leader of a new session and process group
    create_time: float  # psutil's start time of `pid`, to tell it from a later process given the same pid
    started_at: float  # wall clock, for people reading the file


class TaskRecords:
    """The `<workdir>/running/` folder: one `<task_id>-<attempt>.json` per task process of this agent."""

    def __init__(self, workdir: Path) -> None:
        self.folder = Path(workdir) / "running"

    def path(self, task_id: int, attempt: int) -> Path:
        return self.folder / f"{task_id}-{attempt}.json"

    def add(self, *, job_id: int, task_id: int, attempt: int, pid: int) -> TaskRecord | None:
        """Record a just-started process; None (logged) when it cannot be, which only costs reclaiming it later."""
        try:
            create_time = psutil.Process(pid).create_time()  # a zombie still has one: it is not reaped before us
            record = TaskRecord(job_id, task_id, attempt, pid, os.getpgid(pid), create_time, time.time())
            self._write(record)
        except (OSError, psutil.Error) as exc:
            log.warning("could not record task %s attempt %s (pid %s): %s", task_id, attempt, pid, exc)
            return None
        return record

    def _write(self, record: TaskRecord) -> None:
        # Atomic (temp file + rename): an agent killed mid-write leaves the old state or the new one, never half.
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic.write_json(self.path(record.task_id, record.attempt), asdict(record))

    def remove(self, task_id: int, attempt: int) -> None:
        try:
            self.path(task_id, attempt).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove the record of task %s attempt %s: %s", task_id, attempt, exc)

    def load(self) -> list[TaskRecord]:
        """Every readable record; unreadable files and temp leftovers are logged and deleted (nothing to act on)."""
        if not self.folder.is_dir():
            return []
        records = []
        for path in sorted(self.folder.iterdir()):
            if path.suffix == ".json" and not path.name.startswith("."):
                try:
                    records.append(_parse(json.loads(path.read_text())))
                    continue
                except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                    log.warning("dropping unreadable task record %s: %r", path.name, exc)
            path.unlink(missing_ok=True)
        return records


def _parse(raw: dict[str, object]) -> TaskRecord:
    ints = {name: raw[name] for name in ("job_id", "task_id", "attempt", "pid", "pgid")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints.values()):
        raise ValueError(f"bad ids in {ints}")
    if ints["pid"] == 0 or ints["pgid"] == 0:  # killpg(0) would be our own group
        raise ValueError("pid 0")
    return TaskRecord(
        **ints,  # type: ignore[arg-type]
        create_time=float(raw["create_time"]),  # type: ignore[arg-type]
        started_at=float(raw.get("started_at", 0.0)),  # type: ignore[arg-type]
    )


def is_same_process(proc: psutil.Process, create_time: float) -> bool:
    """Whether `proc` is still the process that started at `create_time` (not a later one given the same pid)."""
    try:
        return abs(proc.create_time() - create_time) <= START_TIME_TOLERANCE_S and not _is_zombie(proc)
    except psutil.Error:
        return False


def survivors(record: TaskRecord) -> tuple[bool, list[psutil.Process]]:
    """(leader alive, the record's processes still alive).

    While the leader lives, its process group is the task's (a group id is the leader's pid, which the kernel cannot
    hand out again while the group has members). Once the leader is gone, a process in a group of that id counts
    only if it started after the leader and carries the task's identity in its environment (as every process the
    task spawned inherits it): the group id could belong to a new, unrelated session by now.
    """
    try:
        leader = psutil.Process(record.pid)
    except psutil.Error:
        leader = None
    leader_alive = leader is not None and is_same_process(leader, record.create_time)
    found = [leader] if leader_alive and leader is not None else []
    for proc in psutil.process_iter():
        if proc.pid == record.pid:
            continue
        try:
            if os.getpgid(proc.pid) != record.pgid or _is_zombie(proc):
                continue
            if not leader_alive and not _belongs_to(proc, record):
                continue
        except (OSError, psutil.Error):
            continue
        found.append(proc)
    return leader_alive, found


def _belongs_to(proc: psutil.Process, record: TaskRecord) -> bool:
    if proc.create_time() + START_TIME_TOLERANCE_S < record.create_time:
        return False
    env = proc.environ()
    return env.get("TFDASH_TASK_ID") == str(record.task_id) and env.get("TFDASH_ATTEMPT") == str(record.attempt)


def _is_zombie(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def stop(record: TaskRecord, timeout: float = KILL_WAIT_S) -> list[int]:
    """SIGKILL what is left of the record's task; returns the pids killed once they are gone (or `timeout` passed)."""
    leader_alive, procs = survivors(record)
    if not procs:
        return []
    if leader_alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pgid, signal.SIGKILL)
    else:
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()  # psutil checks the start time first: never a recycled pid
    deadline = time.monotonic() + timeout
    # They are not our children (the old agent was their parent), so there is nothing to wait on: poll.
    while any(not _is_zombie(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    left = [p.pid for p in procs if not _is_zombie(p)]
    if left:
        log.warning("task %s attempt %s: processes %s survived SIGKILL", record.task_id, record.attempt, left)
    return [p.pid for p in procs]


def reclaim(records: TaskRecords) -> list[ReclaimedTask]:
    """Kill whatever the previous agent left running and forget its records; one ReclaimedTask per record."""
    reclaimed = []
    for record in records.load():
        killed = stop(record)
        if killed:
            detail = f"the agent restarted; its process (pid {record.pid}) was still running and was killed"
            log.warning("task %s attempt %s: killed orphaned processes %s", record.task_id, record.attempt, killed)
        else:
            detail = f"the agent restarted; its process (pid {record.pid}) had ended meanwhile (exit code unknown)"
            log.info("task %s attempt %s: its process ended while the agent was down", record.task_id, record.attempt)
        reclaimed.append(ReclaimedTask(record.job_id, record.task_id, record.attempt, record.pid, detail))
        records.remove(record.task_id, record.attempt)
    return reclaimed
