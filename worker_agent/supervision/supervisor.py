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

import base64
import dataclasses
import hashlib
import logging
import os
import signal
import subprocess
import tarfile
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contracts import broker
from contracts.protocol import (
    METRICS_FD_ENV,
    TASK_ARTIFACT,
    TASK_EVENT,
    KillOrder,
    LaunchSpec,
    RecordedExit,
    RunningTask,
    TaskArtifact,
    TaskEvent,
    TaskEventKind,
    TaskReport,
)
from contracts.store import StoreUrls, store_urls_from
from worker_agent.supervision import identity, programs, records, store_sync, tensorboard_dir
from worker_agent.supervision.launch import Refused, check_port, validate
from worker_agent.supervision.ledger import Ledger
from worker_agent.supervision.metrics_pipe import MetricsPipe, SendFn
from worker_agent.supervision.output import LogLine, OutputFiles, TaskLogs
from worker_agent.supervision.processes import killpg, tree_listens_on, wait_for_exit
from worker_agent.supervision.workspace import Prepared, Workspace

log = logging.getLogger(__name__)

Key = tuple[int, int]  # (task_id, attempt)


KEEP_FINISHED = 1_000  # tails of exited tasks kept for debugging
LISTEN_POLL_S = 0.25
READER_JOIN_S = 5.0  # a process that escaped the group (setsid) may hold the metrics pipe open forever
MAX_GRACE_S = 600.0
STORE_SCRATCH = "store-tmp"  # under the workdir: checkpoint tars on their way to or from the object store


@dataclass(eq=False)
class _Child:
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
    uploader: store_sync.CheckpointUploader | None = None  # the authoritative task's, on a cluster with a store
    slots: store_sync.ArtifactSlots | None = None  # its artifact keys in the store


class Supervisor:
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
        self._children: dict[Key, _Child] = {}
        self._tails: OrderedDict[int, deque[LogLine]] = OrderedDict()
        self._closing = False
        self._restores = store_sync.Restores()
        self.records = records.TaskRecords(self.workdir)
        self.ledger = Ledger(self.workdir)
        self.output = OutputFiles(self.workdir)
        # Each task's folders, uid and private /tmp (workspace.py): a job_dir outside workdir and shared roots refused.
        self.workspace = Workspace(self.workdir, [Path(p) for p in shared_roots or ()], task_uids)
        # Requirements venvs (worker_agent/environments/venvs.py, set by the agent): None builds none.
        self.venvs: programs.VenvBuilder | None = None

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

    # --- launching --------------------------------------------------------------------------------------------
    def _reserve(self, spec: LaunchSpec) -> _Child | None:
        """Claim the (task, attempt) slot so two deliveries of one launch cannot both start a process."""
        key = (spec.task_id, spec.attempt)
        with self._lock:
            if self._closing:
                raise Refused(TaskEventKind.LAUNCH_FAILED, "the agent is shutting down")
            if key in self._children or not self.ledger.accept(spec.job_id, *key):
                # Sent again (the orchestrator had not heard of it yet) or redelivered: applied once. What became of
                # the first one reaches the orchestrator by its events and the heartbeat.
                log.info("dropping a repeated launch of task %s attempt %s", *key)
                return None
            holder = next(
                (c for c in self._children.values() if spec.port is not None and c.spec.port == spec.port), None
            )
            if holder is not None:
                self.ledger.forget(*key)
                raise Refused(
                    TaskEventKind.PORT_CONFLICT,
                    f"port {spec.port} is held by task {holder.spec.task_id} attempt {holder.spec.attempt}",
                )
            child = _Child(spec=spec, logs=TaskLogs(spec.task_id, spec.attempt, self._send, self.output))
            self._children[key] = child
            return child

    def _release(self, child: _Child) -> None:
        """A launch refused before its process started: forgotten, so the same order sent again is judged again."""
        with self._lock:
            self._children.pop((child.spec.task_id, child.spec.attempt), None)
            self.ledger.forget(child.spec.task_id, child.spec.attempt)
        self._leave(child)
        child.done.set()

    def _leave(self, child: _Child) -> None:
        """The task's place goes (after the job's last task here: its uid emptied, its private /tmp removed)."""
        if child.placed:
            child.placed = False
            self.workspace.leave(child.spec.job_id, child.uid)

    def _start(self, spec: LaunchSpec, child: _Child) -> tuple[subprocess.Popen[bytes], MetricsPipe]:
        base, python = programs.interpreter_for(spec, self.venvs)
        program = dataclasses.replace(
            programs.load(spec.program), interpreter=python, installations=programs.installations(base, python)
        )
        if spec.port is not None:
            check_port(spec.port)
        prepared = self.workspace.prepare(spec, program)
        child.placed, child.uid = True, prepared.uid
        urls = store_urls_from(spec.store)
        # With a shared folder the checkpoints are there for every host already: only artifacts use the store.
        follows = urls is not None and not spec.job_dir and prepared.job_place is not None
        named = self._restore(spec, urls, prepared) if follows and urls is not None else None
        child.slots = store_sync.ArtifactSlots(urls.artifact_put) if urls is not None else None
        metrics = MetricsPipe(
            spec.task_id,
            spec.attempt,
            self._send,
            owner=prepared.uid,
            artifacts_from=prepared.artifacts_from,
            store_slots=child.slots,
        )
        output: dict[str, int] = {}
        try:
            prepared.env[METRICS_FD_ENV] = str(metrics.write_fd)
            child.tensorboard = prepared.tensorboard
            # Files, not pipes: the task's prints never block on, or die with, this agent (output.py).
            output = self.output.create(spec.task_id, spec.attempt)
            child.logs.open()
            if spec.requirements and self.venvs is not None:  # its build's lines are the task's first output
                self.venvs.ensure(base, spec.requirements, output["stdout"])
            # Through the launcher (root): a fixed environment, the task's on stdin (workspace.Prepared).
            with prepared.process_start() as (env, stdin):
                proc = subprocess.Popen(
                    prepared.argv,
                    cwd=prepared.cwd,
                    env=env,
                    stdin=stdin,
                    stdout=output["stdout"],
                    stderr=output["stderr"],
                    pass_fds=(metrics.write_fd,),
                    start_new_session=True,  # its own process group: one killpg stops it and everything it spawned
                    **prepared.popen,
                )
        except BaseException:
            metrics.discard()
            child.logs.discard()
            self.output.remove(spec.task_id, spec.attempt)
            raise
        finally:
            for fd in output.values():
                os.close(fd)
        # Only the child (and what it passes the fd on to) may hold the write end, or the reader never sees EOF.
        metrics.child_started()
        if follows and urls is not None and urls.uploads_checkpoints and prepared.job_place is not None:
            label = f"task {spec.task_id} attempt {spec.attempt}"
            child.uploader = store_sync.CheckpointUploader(
                urls, prepared.job_place, prepared.uid, self.workdir / STORE_SCRATCH, label, named
            )
            child.uploader.start()
        return proc, metrics

    def _restore(self, spec: LaunchSpec, urls: StoreUrls, prepared: Prepared) -> str | None:
        """The store's last checkpoint unpacked into the job's folder here (store_sync.Restores); refused when the
        store has one that cannot be had: starting over would then overwrite it with an earlier one."""
        assert prepared.job_place is not None
        scratch = self.workdir / STORE_SCRATCH
        try:
            return self._restores.once(spec.job_id, spec.attempt, urls, prepared.job_place, prepared.uid, scratch)
        except (store_sync.StoreError, OSError, tarfile.TarError) as exc:
            raise Refused(
                TaskEventKind.LAUNCH_FAILED, f"could not restore the job's checkpoint from the object store: {exc}"
            ) from None

    # --- running ----------------------------------------------------------------------------------------------
    def _run(self, child: _Child, proc: subprocess.Popen[bytes], metrics: MetricsPipe) -> None:
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

    def _watch_listening(self, child: _Child) -> None:
        assert child.proc is not None and child.spec.port is not None
        while not child.exited.wait(LISTEN_POLL_S):
            if tree_listens_on(child.proc.pid, child.spec.port):
                self._event(child.spec, TaskEventKind.LISTENING, pid=child.proc.pid)
                return

    def _wait(self, child: _Child) -> None:
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

    def _collect_summaries(self, child: _Child) -> None:
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
                store_sync.http_put(taken[1], content, len(content))
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

    def _forget(self, child: _Child, pid: int, returncode: int) -> RecordedExit:
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
                detail=child.kill_reason,
                lines=child.logs.lines,
            )

    # --- killing ----------------------------------------------------------------------------------------------
    def _kill(self, child: _Child, reason: str, *, graceful: bool) -> None:
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

    def _terminate(self, child: _Child, grace: float) -> None:
        self._signal(child, signal.SIGTERM)
        if not child.exited.wait(grace):
            log.info(
                "task %s attempt %s ignored SIGTERM for %.1f s: SIGKILL", child.spec.task_id, child.spec.attempt, grace
            )
            self._signal(child, signal.SIGKILL)

    @staticmethod
    def _signal(child: _Child, sig: signal.Signals) -> None:
        with child.signal_lock:
            if child.proc is not None and not child.reaped:
                killpg(child.proc.pid, sig)

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


# --- helpers ----------------------------------------------------------------------------------------------------
def _remember(table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > KEEP_FINISHED:
        table.popitem(last=False)


def _key(child: _Child) -> Key:
    return child.spec.task_id, child.spec.attempt


def _thread(name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread
