"""The agent's process supervisor: it owns every TF task process the agent starts.

One child per (task_id, attempt), each in its own process group (TF ignores SIGTERM, so a task is stopped by SIGKILL
to its group, which also takes any grandchild with it). Per child, small daemon threads do the waiting:
a tailer reads its stdout and stderr files (output.py: files first, so an agent's death breaks nothing of the task's)
and numbers lines into one sequence, a flusher batches them into TASK_LOGS, a metrics reader
forwards what the task writes to its metrics pipe (see metrics_pipe.py), a watcher reports LISTENING once the task's
port accepts connections, and a waiter reports EXITED after the last log batch and the last metrics.
`launch` and `kill` return at once; nothing here blocks a Celery consumer for the length of a run.

The ledger (ledger.py) makes orders and exits survive loss and restarts: a launch is applied once per
(task, attempt) however often it arrives, an exit is kept until the orchestrator acknowledges it, and `report()`
gives the heartbeat the agent's whole truth in one consistent snapshot.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from contracts.host_reports import RunningTask, TaskReport
from contracts.task_messages import KillOrder, LaunchSpec, TaskEventKind
from worker_agent.supervision import records
from worker_agent.supervision.launch import Refused, validate
from worker_agent.supervision.output import LogLine, TaskLogs
from worker_agent.supervision.supervisor_state import Key
from worker_agent.supervision.task_run import TaskRunning
from worker_agent.supervision.task_start import TaskStarting

log = logging.getLogger(__name__)


class Supervisor(TaskStarting, TaskRunning):
    # --- public API -------------------------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> None:
        """Start the task's process, or report why not; returns as soon as either happened."""
        try:
            validate(spec)
            child = self._reserve(spec)
        except Refused as refused:
            self._event(spec, refused.kind, detail=refused.detail)
            return
        if child is None:
            return
        try:
            proc, metrics = self._start(spec, child)
        except Refused as refused:
            self._release(child)
            self._event(spec, refused.kind, detail=refused.detail)
            return
        except Exception as exc:  # Popen's errors (OSError, ValueError, ...), a full disk, ...: refuse, never raise
            self._release(child)
            log.warning("task %s attempt %s could not start: %s", spec.task_id, spec.attempt, exc)
            self._event(spec, TaskEventKind.LAUNCH_FAILED, detail=f"could not start: {exc}")
            return
        self._run(child, proc, metrics)

    def acknowledge_exits(self, keys: list[Key]) -> None:
        """The orchestrator stored these exits: they no longer ride on the heartbeat."""
        done = self.ledger.acknowledge(keys)
        log.debug("%d exit(s) acknowledged", done)

    def report(self) -> TaskReport:
        """What runs here, the exits not yet acknowledged and the last event number, as one snapshot: an exit moves
        from `running` to `exits` under the same lock, so no report can miss a task in between."""
        with self._lock:
            # Listed from its launch (pid 0 while it is prepared: a requirements venv may take minutes to build, and a
            # task listed nowhere has its launch order sent again) until its exit is recorded (its last output
            # drains first).
            running = [
                RunningTask(c.spec.job_id, c.spec.task_id, c.spec.attempt, c.proc.pid if c.proc is not None else 0)
                for c in self._children.values()
            ]
            return TaskReport(running=running, exits=self.ledger.unacknowledged(), events_upto=self.ledger.events_upto)

    def kill(self, order: KillOrder) -> None:
        """SIGTERM the task's process group, then SIGKILL after its grace period; returns at once."""
        with self._lock:
            child = self._children.get((order.task_id, order.attempt))
            if child is None and self.ledger.accept(order.job_id, order.task_id, order.attempt):
                # Its launch never arrived (lost, or still queued behind this kill): it never may run now, and the
                # orchestrator hears that it is over like any other exit.
                ended = self.ledger.record_exit(
                    order.job_id, order.task_id, order.attempt, detail="killed before it started"
                )
            else:
                ended = None
        if ended is not None:
            log.info("task %s attempt %s killed before it started", order.task_id, order.attempt)
            self._send_exit(ended)
            return
        if child is None or child.spec.job_id != order.job_id:
            log.info(
                "kill for task %s attempt %s of job %s: not running here", order.task_id, order.attempt, order.job_id
            )
            return
        self._kill(child, order.reason or "killed on request", graceful=True)

    def kill_all(self, reason: str, timeout: float = 10) -> None:
        """SIGKILL every task (used at agent shutdown) and wait until each one's EXITED has been handed on."""
        with self._lock:
            self._closing = True
            children = list(self._children.values())
        for child in children:
            self._kill(child, reason, graceful=False)
        deadline = time.monotonic() + timeout
        for child in children:
            if not child.done.wait(max(0.0, deadline - time.monotonic())):
                log.warning(
                    "task %s attempt %s did not report its exit in time", child.spec.task_id, child.spec.attempt
                )
        self.workspace.close()

    def reclaim(self) -> list[records.ReclaimedTask]:
        """Kill what a previous agent with this workdir left running (see records.py) and record each such task as
        lost, like every attempt the previous life took but never started; call before any launch."""
        reclaimed = records.reclaim(self.records)
        self.workspace.sweep()  # what those tasks (or ones before) left running under their uid, and in their /tmp
        # Their processes are gone: what they printed (while the agent was down too) is in their files, read from
        # where the last life had got to, and sent before their exits.
        lines = {key: TaskLogs(*key, self._send, self.output).drain() for key in self.output.leftovers()}
        for task in reclaimed:
            self.ledger.record_exit(
                task.job_id,
                task.task_id,
                task.attempt,
                pid=task.pid,
                detail=task.detail,
                lost=True,
                lines=lines.get((task.task_id, task.attempt)),
            )
        for entry in self.ledger.accepted():
            self.ledger.record_exit(
                entry.job_id,
                entry.task_id,
                entry.attempt,
                detail="the agent restarted before the task's process started",
                lost=True,
            )
        return reclaimed

    def running(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"task_id": c.spec.task_id, "attempt": c.spec.attempt, "pid": c.proc.pid, "job_id": c.spec.job_id}
                for c in self._children.values()
                if c.proc is not None and not c.exited.is_set()
            ]

    def tail(self, task_id: int) -> list[LogLine]:
        """The last lines of the task's latest attempt (running or exited), for debugging."""
        with self._lock:
            running = [c for (tid, _), c in self._children.items() if tid == task_id]
            if running:
                return max(running, key=lambda c: c.spec.attempt).logs.tail_lines()
            return list(self._tails.get(task_id, ()))
