"""A started task's life: the supervisor's threads that watch it, and how it is stopped.

Per child, small daemon threads do the waiting: a tailer reads its output files and a flusher sends them as
TASK_LOGS, the metrics pipe's reader forwards its metrics, a watcher reports LISTENING once its port accepts
connections, and a waiter reaps it, drains all of that, packs its summaries and reports EXITED last. A kill is
SIGTERM to the task's process group, then SIGKILL after its grace period (TF ignores SIGTERM).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import signal
import subprocess
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from contracts import broker
from contracts.host_reports import RecordedExit
from contracts.metric_messages import TaskArtifact
from contracts.protocol import TASK_ARTIFACT
from contracts.task_messages import TaskEventKind
from worker_agent.supervision import oom_evidence, tensorboard_dir
from worker_agent.supervision.metrics_pipe import MetricsPipe
from worker_agent.supervision.processes import killpg, tree_listens_on, wait_for_exit
from worker_agent.supervision.store_http import http_put
from worker_agent.supervision.supervisor_state import Child, Key, SupervisorState

log = logging.getLogger(__name__)


KEEP_FINISHED = 1_000  # tails of exited tasks kept for debugging
LISTEN_POLL_S = 0.25
READER_JOIN_S = 5.0  # a process that escaped the group (setsid) may hold the metrics pipe open forever
MAX_GRACE_S = 600.0


class TaskRunning(SupervisorState):
    # --- running ----------------------------------------------------------------------------------------------
    def _run(self, child: Child, proc: subprocess.Popen[bytes], metrics: MetricsPipe) -> None:
        spec = child.spec
        with self._lock:
            child.proc = proc
            child.metrics = metrics
            kill_pending = child.kill_pending
        log.info("task %s attempt %s started: pid %s", spec.task_id, spec.attempt, proc.pid)
        # On disk before anyone hears of the process: an agent that dies from here on leaves it for the next to kill.
        self.records.add(job_id=spec.job_id, task_id=spec.task_id, attempt=spec.attempt, pid=proc.pid)
        # STARTED goes out before any thread that could send logs or EXITED exists.
        self._event(spec, TaskEventKind.STARTED, pid=proc.pid)
        name = f"{spec.task_id}.{spec.attempt}"
        child.tailer = _thread(f"tail-{name}", child.logs.run_tailer)
        child.flusher = _thread(f"logs-{name}", child.logs.run_flusher)
        metrics.start(name)
        if spec.port is not None:
            child.watcher = _thread(f"listen-{name}", self._watch_listening, child)
        _thread(f"wait-{name}", self._wait, child)
        if kill_pending:
            self._kill(child, child.kill_reason, graceful=False)

    def _watch_listening(self, child: Child) -> None:
        assert child.proc is not None and child.spec.port is not None
        while not child.exited.wait(LISTEN_POLL_S):
            if tree_listens_on(child.proc.pid, child.spec.port):
                self._event(child.spec, TaskEventKind.LISTENING, pid=child.proc.pid)
                return

    def _wait(self, child: Child) -> None:
        proc = child.proc
        assert proc is not None
        wait_for_exit(proc)
        child.exited.set()
        if child.uploader is not None:
            try:
                child.uploader.finish()  # before EXITED: a restart restores the last checkpoint
            except Exception:
                log.exception("task %s attempt %s: last checkpoint upload failed", *_key(child))
        with child.signal_lock:
            # The leader is a zombie until reaped, so its pid (= the group id) cannot be reused yet: safe to killpg.
            # Killing the group before draining the pipes also ends a grandchild that holds them open.
            killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait()
            child.reaped = True
        # After the job's last task here, nothing its uid runs (a setsid grandchild that escaped the group)
        # survives, and the uid is free before EXITED goes out.
        self._leave(child)
        # Nothing of the group writes any more: read the files to their end.
        child.logs.end()
        if child.tailer is not None:
            child.tailer.join()
        if child.metrics is not None:
            # The group is dead, so EOF is due at once; the last epoch's metrics go out before EXITED.
            child.metrics.finish(READER_JOIN_S)
        self._collect_summaries(child)
        child.logs.close()
        if child.flusher is not None:
            child.flusher.join()
        child.logs.flush(last=True)
        if child.watcher is not None:
            child.watcher.join()  # no LISTENING may follow EXITED
        ended = self._forget(child, proc.pid, returncode)
        log.info("task %s attempt %s exited: %s", child.spec.task_id, child.spec.attempt, returncode)
        self._send_exit(ended)
        # After the exit is in the ledger: an agent killed in between finds both and reports the recorded exit.
        self.records.remove(child.spec.task_id, child.spec.attempt)
        child.done.set()

    def _collect_summaries(self, child: Child) -> None:
        """What the task wrote under its TFDASH_TENSORBOARD_DIR, as one artifact (before its EXITED goes out)."""
        if child.tensorboard is None:
            return
        spec = child.spec
        try:
            content = tensorboard_dir.pack(child.tensorboard, child.uid)
            if content is None:
                return
            name, digest = tensorboard_dir.artifact_name(spec), hashlib.sha256(content).hexdigest()
            taken = child.slots.take() if child.slots else None
            if taken is not None:  # on a cluster with an object store: there, not through the broker
                http_put(taken[1], content, len(content))
                artifact = TaskArtifact(spec.task_id, spec.attempt, name, digest, "", size=len(content), slot=taken[0])
            else:
                artifact = TaskArtifact(
                    task_id=spec.task_id,
                    attempt=spec.attempt,
                    name=name,
                    sha256=digest,
                    content_b64=base64.b64encode(content).decode("ascii"),
                )
            self._send(TASK_ARTIFACT, asdict(artifact), queue=broker.METRICS)
            log.info("task %s attempt %s: summaries collected (%d bytes)", spec.task_id, spec.attempt, len(content))
        except Exception:  # never expected; the exit must go out whatever happens here
            log.exception("task %s attempt %s: could not collect its summaries", spec.task_id, spec.attempt)

    def _forget(self, child: Child, pid: int, returncode: int) -> RecordedExit:
        spec = child.spec
        with self._lock:
            self._children.pop((spec.task_id, spec.attempt), None)
            _remember(self._tails, spec.task_id, child.logs.tail)
            return self.ledger.record_exit(
                spec.job_id,
                spec.task_id,
                spec.attempt,
                pid=pid,
                exit_code=returncode,
                detail=child.kill_reason or _unexplained_kill(child, pid, returncode),
                lines=child.logs.lines,
            )

    # --- killing ----------------------------------------------------------------------------------------------
    def _kill(self, child: Child, reason: str, *, graceful: bool) -> None:
        with self._lock:
            first = not child.kill_reason
            if first:
                child.kill_reason = reason
            if child.proc is None:
                child.kill_pending = True  # `_run` kills it as soon as it exists
                return
        if not graceful:
            self._signal(child, signal.SIGKILL)
        elif first:  # a second kill order while the first is in its grace period changes nothing
            grace = min(float(child.spec.kill_grace_s), MAX_GRACE_S)
            _thread(f"kill-{child.spec.task_id}.{child.spec.attempt}", self._terminate, child, grace)

    def _terminate(self, child: Child, grace: float) -> None:
        self._signal(child, signal.SIGTERM)
        if not child.exited.wait(grace):
            log.info(
                "task %s attempt %s ignored SIGTERM for %.1f s: SIGKILL", child.spec.task_id, child.spec.attempt, grace
            )
            self._signal(child, signal.SIGKILL)

    @staticmethod
    def _signal(child: Child, sig: signal.Signals) -> None:
        with child.signal_lock:
            if child.proc is not None and not child.reaped:
                killpg(child.proc.pid, sig)


# --- helpers ----------------------------------------------------------------------------------------------------
def _remember(table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > KEEP_FINISHED:
        table.popitem(last=False)


def _unexplained_kill(child: Child, pid: int, returncode: int) -> str:
    """A SIGKILL the agent did not send: the kernel's log says when its OOM killer sent it (oom_evidence.py)."""
    if returncode != -signal.SIGKILL:
        return ""
    return oom_evidence.kernel_oom_kill({pid}, child.uid)


def _key(child: Child) -> Key:
    return child.spec.task_id, child.spec.attempt


def _thread(name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread
