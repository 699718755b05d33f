"""What every part of the supervisor shares: its state and how it hands on a task's events.

`SupervisorState` holds the children (one `Child` per (task_id, attempt)), the ledger, the records, the output files
and the workspace; the supervisor's parts (task_start.py, task_run.py, supervisor.py) build on it. Events go out
numbered by the ledger, and a failing sender never kills the thread that hands one on.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contracts.host_reports import RecordedExit
from contracts.protocol import TASK_EVENT
from contracts.task_messages import LaunchSpec, TaskEvent, TaskEventKind
from worker_agent.supervision import identity, programs, records
from worker_agent.supervision.checkpoint_restore import Restores
from worker_agent.supervision.checkpoint_upload import CheckpointUploader
from worker_agent.supervision.ledger import Ledger
from worker_agent.supervision.metrics_pipe import MetricsPipe, SendFn
from worker_agent.supervision.output import LogLine, OutputFiles, TaskLogs
from worker_agent.supervision.store_http import ArtifactSlots
from worker_agent.supervision.workspace import Workspace

log = logging.getLogger(__name__)

Key = tuple[int, int]  # (task_id, attempt)


@dataclass(eq=False)
class Child:
    spec: LaunchSpec
    logs: TaskLogs
    proc: subprocess.Popen[bytes] | None = None  # None while the launch is still being prepared
    kill_reason: str = ""
    kill_pending: bool = False  # a kill arrived before the process existed
    reaped: bool = False
    exited: threading.Event = field(default_factory=threading.Event)  # the group leader ended (not yet reaped)
    done: threading.Event = field(default_factory=threading.Event)  # EXITED sent, or the launch was refused
    signal_lock: threading.Lock = field(default_factory=threading.Lock)
    tailer: threading.Thread | None = None
    metrics: MetricsPipe | None = None
    placed: bool = False  # the task has a place in the workspace: left once, when it is over
    uid: int | None = None  # the job's own user id (--task-uids), released when the task is over
    flusher: threading.Thread | None = None
    watcher: threading.Thread | None = None
    tensorboard: Path | None = None  # the task's TFDASH_TENSORBOARD_DIR, packed as an artifact when it ends
    uploader: CheckpointUploader | None = None  # the authoritative task's, on a cluster with a store
    slots: ArtifactSlots | None = None  # its artifact keys in the store


class SupervisorState:
    def __init__(
        self,
        outbox_send: SendFn,
        workdir: Path,
        task_uids: identity.UidRange | None = None,
        shared_roots: list[Path] | None = None,
    ) -> None:
        # Events go out as (name, body), for the host's events stream; logs and metrics pipes add queue=broker.METRICS.
        self._send = outbox_send
        self.workdir = Path(workdir).expanduser().resolve()
        self._lock = threading.Lock()
        self._children: dict[Key, Child] = {}
        self._tails: OrderedDict[int, deque[LogLine]] = OrderedDict()
        self._closing = False
        self._restores = Restores()
        self.records = records.TaskRecords(self.workdir)
        self.ledger = Ledger(self.workdir)
        self.output = OutputFiles(self.workdir)
        # Each task's folders, uid and private /tmp (workspace.py): a job_dir outside workdir and shared roots refused.
        self.workspace = Workspace(self.workdir, [Path(p) for p in shared_roots or ()], task_uids)
        # Requirements venvs (worker_agent/environments/venvs.py, set by the agent): None builds none.
        self.venvs: programs.VenvBuilder | None = None

    def _leave(self, child: Child) -> None:
        """The task's place goes (after the job's last task here: its uid emptied, its private /tmp removed)."""
        if child.placed:
            child.placed = False
            self.workspace.leave(child.spec.job_id, child.uid)

    # --- reporting --------------------------------------------------------------------------------------------
    def _event(self, spec: LaunchSpec, kind: str, **fields: Any) -> None:
        event = TaskEvent(task_id=spec.task_id, attempt=spec.attempt, kind=kind, seq=self.ledger.next_seq(), **fields)
        if kind in (TaskEventKind.LAUNCH_FAILED, TaskEventKind.PORT_CONFLICT):
            log.warning("task %s attempt %s: %s: %s", spec.task_id, spec.attempt, kind, event.detail)
        self._hand_on(event)

    def _send_exit(self, ended: RecordedExit) -> None:
        """The EXITED event of a recorded exit, numbered as in the ledger (heartbeats repeat it until acknowledged)."""
        self._hand_on(ended.as_event())

    def _hand_on(self, event: TaskEvent) -> None:
        try:
            self._send(TASK_EVENT, asdict(event))
        except Exception:  # the outbox never raises; an injected sender might, and must not kill a waiter thread
            log.exception("could not hand on %s for task %s", event.kind, event.task_id)
