"""What the agent must not forget across its own restarts (kept under `<workdir>/ledger/`, one small JSON file per
task attempt, written atomically):

- every task attempt it took a launch order for, so a launch the orchestrator sends again (it resends until it
  hears of the task) is applied once, even by the agent's next life;
- how each one ended, until the orchestrator acknowledges the exit (AGENT_ACK_EXITS): the exits ride on every
  heartbeat until then, so an EXITED event lost anywhere (the broker, an orchestrator crash, this agent dying
  before its outbox sent it) is still heard;
- its event clock: every task event gets the next number of one clock that only grows, across restarts too, so the
  orchestrator can tell a redelivered event from a new one and a report from before an event from one after it.

Acknowledged attempts are kept (as `acked`) for KEEP_ACKED more attempts so a late duplicate launch still finds them;
older ones are deleted. Files are not fsynced: they survive the agent being killed, not the machine losing power
(after which every task of the host is gone anyway and is reported lost).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from contracts.host_reports import MAX_REPORTED_EXITS, RecordedExit
from worker_agent import atomic

log = logging.getLogger(__name__)

KEEP_ACKED = 10_000

Key = tuple[int, int]  # (task_id, attempt)


class State:
    ACCEPTED = "accepted"  # a launch order was taken; the process may or may not have started
    EXITED = "exited"  # it ended (or never will start); waiting for the orchestrator's acknowledgement
    ACKED = "acked"  # the orchestrator stored the exit


@dataclass(frozen=True)
class Entry:
    job_id: int
    task_id: int
    attempt: int
    state: str
    seq: int = 0  # the exit's event number (EXITED and ACKED)
    pid: int = 0
    exit_code: int | None = None
    detail: str = ""
    lost: bool = False
    lines: int | None = None  # the task's output lines, all sent before its exit

    @property
    def key(self) -> Key:
        return (self.task_id, self.attempt)

    def as_exit(self) -> RecordedExit:
        return RecordedExit(
            job_id=self.job_id,
            task_id=self.task_id,
            attempt=self.attempt,
            seq=self.seq,
            pid=self.pid,
            exit_code=self.exit_code,
            detail=self.detail,
            lost=self.lost,
            lines=self.lines,
        )


class Ledger:
    def __init__(self, workdir: Path) -> None:
        self.folder = Path(workdir) / "ledger"
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._entries: dict[Key, Entry] = {}
        self._acked: OrderedDict[Key, None] = OrderedDict()  # oldest first, for pruning
        self._load()
        # Microseconds of wall time, and never below anything this workdir has seen: a restarted agent's events
        # come after its previous life's even if the clock stepped back a little.
        self._clock = max([time.time_ns() // 1000, *(e.seq for e in self._entries.values())])

    # --- the event clock ------------------------------------------------------------------------------------------
    def next_seq(self) -> int:
        with self._lock:
            return self._tick()

    def _tick(self) -> int:
        """The next number of the clock (called holding the lock)."""
        self._clock = max(self._clock + 1, time.time_ns() // 1000)
        return self._clock

    @property
    def events_upto(self) -> int:
        """The number of the last event numbered so far."""
        with self._lock:
            return self._clock

    # --- launches -------------------------------------------------------------------------------------------------
    def accept(self, job_id: int, task_id: int, attempt: int) -> bool:
        """Take a launch (or a kill for an attempt never launched here): False when this attempt was seen before."""
        with self._lock:
            if (task_id, attempt) in self._entries:
                return False
            self._put(Entry(job_id, task_id, attempt, State.ACCEPTED))
            return True

    def forget(self, task_id: int, attempt: int) -> None:
        """Undo `accept` for a launch refused before anything started, so the order, sent again, is judged again."""
        with self._lock:
            entry = self._entries.pop((task_id, attempt), None)
            if entry is not None:
                self._path(entry.key).unlink(missing_ok=True)

    def accepted(self) -> list[Entry]:
        """Attempts taken but not ended: after a restart, the ones whose process never started (or was reclaimed)."""
        with self._lock:
            return [e for e in self._entries.values() if e.state == State.ACCEPTED]

    # --- exits ----------------------------------------------------------------------------------------------------
    def record_exit(
        self,
        job_id: int,
        task_id: int,
        attempt: int,
        *,
        pid: int = 0,
        exit_code: int | None = None,
        detail: str = "",
        lost: bool = False,
        lines: int | None = None,
    ) -> RecordedExit:
        """Number the attempt's exit and keep it until acknowledged; the caller sends it as its EXITED event."""
        with self._lock:
            entry = Entry(
                job_id, task_id, attempt, State.EXITED, self._tick(), pid, exit_code, detail[:500], lost, lines
            )
            self._put(entry)
            return entry.as_exit()

    def unacknowledged(self) -> list[RecordedExit]:
        with self._lock:
            exits = sorted((e for e in self._entries.values() if e.state == State.EXITED), key=lambda e: e.seq)
            return [e.as_exit() for e in exits[:MAX_REPORTED_EXITS]]

    def acknowledge(self, keys: list[Key]) -> int:
        """The orchestrator stored these exits; returns how many were waiting."""
        done = 0
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None or entry.state != State.EXITED:
                    continue
                self._put(replace(entry, state=State.ACKED))
                done += 1
            while len(self._acked) > KEEP_ACKED:
                old, _ = self._acked.popitem(last=False)
                self._entries.pop(old, None)
                self._path(old).unlink(missing_ok=True)
        return done

    # --- storage --------------------------------------------------------------------------------------------------
    def _path(self, key: Key) -> Path:
        return self.folder / f"{key[0]}-{key[1]}.json"

    def _put(self, entry: Entry) -> None:
        """Write first, then remember: what the agent acts on is always on disk (called holding the lock)."""
        atomic.write_json(self._path(entry.key), asdict(entry))
        self._entries[entry.key] = entry
        if entry.state == State.ACKED:
            self._acked[entry.key] = None

    def _load(self) -> None:
        found = []
        for path in self.folder.iterdir():
            if path.suffix != ".json" or path.name.startswith("."):
                path.unlink(missing_ok=True)  # a temp file from a write that was cut off
                continue
            try:
                found.append(_parse(json.loads(path.read_text())))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("dropping unreadable ledger entry %s: %r", path.name, exc)
                path.unlink(missing_ok=True)
        for entry in sorted(found, key=lambda e: e.seq):
            self._entries[entry.key] = entry
            if entry.state == State.ACKED:
                self._acked[entry.key] = None


def _parse(raw: dict[str, object]) -> Entry:
    entry = Entry(**raw)  # type: ignore[arg-type]
    ints = (entry.job_id, entry.task_id, entry.attempt, entry.seq, entry.pid)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
        raise ValueError(f"bad numbers in {raw}")
    if entry.state not in (State.ACCEPTED, State.EXITED, State.ACKED):
        raise ValueError(f"bad state {entry.state!r}")
    return entry
