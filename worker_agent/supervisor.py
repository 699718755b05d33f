"""The agent's process supervisor: it owns every TF task process the agent starts.

One child per (task_id, attempt), each in its own process group (TF ignores SIGTERM, so a task is stopped by SIGKILL
to its group, which also takes any grandchild with it). Per child, small daemon threads do the waiting:
two readers (stdout, stderr) number lines into one sequence, a flusher batches them into TASK_LOGS, a metrics reader
forwards what the task writes to its metrics pipe (see metrics_pipe.py), a watcher reports LISTENING once the task's
port accepts connections, and a waiter reports EXITED after the last log batch and the last metrics.
`launch` and `kill` return at once; nothing here blocks a Celery consumer for the length of a run.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from contracts.limits import MAX_LOG_LINE_CHARS
from contracts.protocol import (
    JOB_DIR_ENV,
    METRICS_FD_ENV,
    TASK_EVENT,
    TASK_LOGS,
    KillOrder,
    LaunchSpec,
    ProgramSpec,
    ReclaimedTask,
    TaskEvent,
    TaskEventKind,
    TaskLogBatch,
)
from worker_agent import records
from worker_agent.metrics_pipe import MetricsPipe

log = logging.getLogger(__name__)

SendFn = Callable[[str, dict[str, Any]], None]
Key = tuple[int, int]  # (task_id, attempt)
LogLine = tuple[int, str, str]  # (seq, stream, text)

HOOKS_DIR = Path(__file__).resolve().parent / "hooks"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the folder holding `worker_agent`, for `-m worker_agent...`

MAX_LINE_BYTES = 4 * MAX_LOG_LINE_CHARS  # UTF-8: at most 4 bytes a character, so a capped line always fits one read
BATCH_LINES = 200
BATCH_CHARS = 1_000_000  # keeps one Redis message reasonable even when every line is at the cap
BATCH_AGE_S = 0.5
TAIL_LINES = 200
KEEP_FINISHED = 1_000  # remembered finished attempts (redelivered launches) and tails of exited tasks
LISTEN_POLL_S = 0.25
READER_JOIN_S = 5.0  # a process that escaped the group (setsid) may hold a pipe open forever
MAX_GRACE_S = 600.0
SECRET_MARKERS = ("TOKEN", "PASSWORD", "SECRET")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")


class _Refused(Exception):
    """A launch that must not (or could not) start: reported as `kind` with `detail`, nothing left running."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class _TaskLogs:
    """One task attempt's output: numbered lines, batched to TASK_LOGS, with a tail kept for debugging."""

    def __init__(self, task_id: int, attempt: int, send: SendFn) -> None:
        self.task_id = task_id
        self.attempt = attempt
        self._send = send
        self._cond = threading.Condition()
        self._pending: list[LogLine] = []
        self._first_at = 0.0
        self._next_seq = 0
        self._closed = False
        # Held while a batch is handed to the outbox, so batches leave in seq order whoever flushes them.
        self._send_lock = threading.Lock()
        self.tail: deque[LogLine] = deque(maxlen=TAIL_LINES)

    def add(self, stream: str, text: str) -> None:
        with self._cond:
            line = (self._next_seq, stream, text)
            self._next_seq += 1
            if not self._pending:
                self._first_at = time.monotonic()
                self._cond.notify_all()  # starts the flusher's 0.5 s clock
            self._pending.append(line)
            self.tail.append(line)
            if len(self._pending) >= BATCH_LINES:
                self._cond.notify_all()

    def run_flusher(self) -> None:
        while self._wait_for_batch():
            self.flush()

    def _wait_for_batch(self) -> bool:
        """True when a batch is due (200 lines, or the oldest unsent line is 0.5 s old); False once closed."""
        with self._cond:
            while not self._closed:
                if len(self._pending) >= BATCH_LINES:
                    return True
                if not self._pending:
                    self._cond.wait()
                    continue
                left = self._first_at + BATCH_AGE_S - time.monotonic()
                if left <= 0:
                    return True
                self._cond.wait(left)
            return False

    def flush(self) -> None:
        with self._send_lock:
            with self._cond:
                lines, self._pending = self._pending, []
            for chunk in _chunks(lines):
                batch = TaskLogBatch(task_id=self.task_id, attempt=self.attempt, lines=chunk)
                self._send(TASK_LOGS, asdict(batch))

    def tail_lines(self) -> list[LogLine]:
        with self._cond:
            return list(self.tail)

    def close(self) -> None:
        """Stop the flusher; the caller flushes what is left."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


@dataclass(eq=False)
class _Child:
    spec: LaunchSpec
    logs: _TaskLogs
    proc: subprocess.Popen[bytes] | None = None  # None while the launch is still being prepared
    kill_reason: str = ""
    kill_pending: bool = False  # a kill arrived before the process existed
    reaped: bool = False
    exited: threading.Event = field(default_factory=threading.Event)  # the group leader ended (not yet reaped)
    done: threading.Event = field(default_factory=threading.Event)  # EXITED sent, or the launch was refused
    signal_lock: threading.Lock = field(default_factory=threading.Lock)
    readers: list[threading.Thread] = field(default_factory=list)
    metrics: MetricsPipe | None = None
    flusher: threading.Thread | None = None
    watcher: threading.Thread | None = None


class Supervisor:
    def __init__(self, outbox_send: SendFn, workdir: Path) -> None:
        self._send = outbox_send
        self.workdir = Path(workdir).expanduser().resolve()
        self._lock = threading.Lock()
        self._children: dict[Key, _Child] = {}
        self._finished: OrderedDict[Key, None] = OrderedDict()
        self._tails: OrderedDict[int, deque[LogLine]] = OrderedDict()
        self._closing = False
        self.records = records.TaskRecords(self.workdir)

    # --- public API -------------------------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> None:
        """Start the task's process, or report why not; returns as soon as either happened."""
        try:
            _validate(spec)
            child = self._reserve(spec)
        except _Refused as refused:
            self._event(spec, refused.kind, detail=refused.detail)
            return
        if child is None:
            return
        try:
            proc, metrics = self._start(spec)
        except _Refused as refused:
            self._release(child)
            self._event(spec, refused.kind, detail=refused.detail)
            return
        except Exception as exc:  # Popen's errors (OSError, ValueError, ...), a full disk, ...: refuse, never raise
            self._release(child)
            log.warning("task %s attempt %s could not start: %s", spec.task_id, spec.attempt, exc)
            self._event(spec, TaskEventKind.LAUNCH_FAILED, detail=f"could not start: {exc}")
            return
        self._run(child, proc, metrics)

    def kill(self, order: KillOrder) -> None:
        """SIGTERM the task's process group, then SIGKILL after its grace period; returns at once."""
        with self._lock:
            child = self._children.get((order.task_id, order.attempt))
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

    def reclaim(self) -> list[ReclaimedTask]:
        """Kill what a previous agent with this workdir left running (see records.py); call before any launch."""
        return records.reclaim(self.records)

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
                raise _Refused(TaskEventKind.LAUNCH_FAILED, "the agent is shutting down")
            if key in self._children:
                raise _Refused(
                    TaskEventKind.LAUNCH_FAILED, f"task {spec.task_id} attempt {spec.attempt} is already running"
                )
            if key in self._finished:
                # A redelivered message: the orchestrator already had STARTED and EXITED for this attempt.
                log.warning("dropping a repeated launch of task %s attempt %s: it already ran", *key)
                return None
            holder = next(
                (c for c in self._children.values() if spec.port is not None and c.spec.port == spec.port), None
            )
            if holder is not None:
                raise _Refused(
                    TaskEventKind.PORT_CONFLICT,
                    f"port {spec.port} is held by task {holder.spec.task_id} attempt {holder.spec.attempt}",
                )
            child = _Child(spec=spec, logs=_TaskLogs(spec.task_id, spec.attempt, self._send))
            self._children[key] = child
            return child

    def _release(self, child: _Child) -> None:
        with self._lock:
            self._children.pop((child.spec.task_id, child.spec.attempt), None)
        child.done.set()

    def _start(self, spec: LaunchSpec) -> tuple[subprocess.Popen[bytes], MetricsPipe]:
        argv = self._argv(spec.program)
        if spec.port is not None:
            _check_port(spec.port)
        cwd = self.workdir / "jobs" / str(spec.job_id) / f"{spec.task_type}-{spec.task_index}-a{spec.attempt}"
        # The attempt is in the name, so a restart gets a new folder; exist_ok only for a retried refused launch.
        cwd.mkdir(parents=True, exist_ok=True)
        job_dir = self.job_dir(spec)
        job_dir.mkdir(parents=True, exist_ok=True)  # shared by the job's tasks on this host and by its attempts
        env = child_env(spec)
        metrics = MetricsPipe(spec.task_id, spec.attempt, self._send)
        try:
            env[METRICS_FD_ENV] = str(metrics.write_fd)
            env[JOB_DIR_ENV] = str(job_dir)
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(metrics.write_fd,),
                start_new_session=True,  # its own process group: one killpg stops it and everything it spawned
            )
        except BaseException:
            metrics.discard()
            raise
        # Only the child (and what it passes the fd on to) may hold the write end, or the reader never sees EOF.
        metrics.child_started()
        return proc, metrics

    def job_dir(self, spec: LaunchSpec) -> Path:
        """Where the task keeps checkpoints and artifacts: the spec's folder, or one per job under the workdir."""
        if spec.job_dir:
            return Path(spec.job_dir)
        return self.workdir / "jobs" / str(spec.job_id) / "shared"

    def _argv(self, program: ProgramSpec) -> list[str]:
        if program.kind == "script":
            return [sys.executable, "-u", str(self._script_path(program)), *program.args]
        if program.kind == "builtin":
            if not program.builtin:
                raise _Refused(TaskEventKind.LAUNCH_FAILED, "builtin program without a name")
            config = json.dumps(program.builtin_config)
            return [
                sys.executable, "-u", "-m", "worker_agent.runtime",
                "--program", program.builtin, "--config-json", config, *program.args,
            ]  # fmt: skip
        raise _Refused(TaskEventKind.LAUNCH_FAILED, f"unknown program kind {program.kind!r}")

    def _script_path(self, program: ProgramSpec) -> Path:
        try:
            content = base64.b64decode(program.script_b64, validate=True)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise _Refused(TaskEventKind.LAUNCH_FAILED, f"script content is not valid base64: {exc}") from None
        digest = hashlib.sha256(content).hexdigest()
        if not isinstance(program.script_sha256, str) or digest != program.script_sha256.lower():
            raise _Refused(
                TaskEventKind.LAUNCH_FAILED,
                f"script sha256 mismatch: expected {program.script_sha256!r}, content has {digest}",
            )
        return self._cache_script(digest, content)

    def _cache_script(self, digest: str, content: bytes) -> Path:
        """Content-addressed: written once, atomically (temp file + rename), shared by every task running it."""
        path = self.workdir / "scripts" / f"{digest}.py"
        if path.exists():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{digest}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(content)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

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
        assert proc.stdout is not None and proc.stderr is not None
        child.readers = [
            _thread(f"out-{name}", self._read, proc.stdout, "stdout", child.logs),
            _thread(f"err-{name}", self._read, proc.stderr, "stderr", child.logs),
        ]
        child.flusher = _thread(f"logs-{name}", child.logs.run_flusher)
        metrics.start(name)
        if spec.port is not None:
            child.watcher = _thread(f"listen-{name}", self._watch_listening, child)
        _thread(f"wait-{name}", self._wait, child)
        if kill_pending:
            self._kill(child, child.kill_reason, graceful=False)

    @staticmethod
    def _read(stream: IO[bytes], name: str, logs: _TaskLogs) -> None:
        try:
            while raw := stream.readline(MAX_LINE_BYTES):
                if len(raw) >= MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    _skip_rest_of_line(stream)  # keep the capped head, drop the rest of a giant line
                logs.add(name, _decode_line(raw))
        except (OSError, ValueError) as exc:  # the pipe was closed under us
            log.debug("reader %s stopped: %s", name, exc)
        finally:
            stream.close()

    def _watch_listening(self, child: _Child) -> None:
        assert child.proc is not None and child.spec.port is not None
        while not child.exited.wait(LISTEN_POLL_S):
            if tree_listens_on(child.proc.pid, child.spec.port):
                self._event(child.spec, TaskEventKind.LISTENING, pid=child.proc.pid)
                return

    def _wait(self, child: _Child) -> None:
        proc = child.proc
        assert proc is not None
        _wait_for_exit(proc)
        child.exited.set()
        with child.signal_lock:
            # The leader is a zombie until reaped, so its pid (= the group id) cannot be reused yet: safe to killpg.
            # Killing the group before draining the pipes also ends a grandchild that holds them open.
            _killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait()
            child.reaped = True
        for reader in child.readers:
            reader.join(READER_JOIN_S)
        if child.metrics is not None:
            # The group is dead, so EOF is due at once; the last epoch's metrics go out before EXITED.
            child.metrics.finish(READER_JOIN_S)
        child.logs.close()
        if child.flusher is not None:
            child.flusher.join()
        child.logs.flush()
        if child.watcher is not None:
            child.watcher.join()  # no LISTENING may follow EXITED
        self._forget(child)
        log.info("task %s attempt %s exited: %s", child.spec.task_id, child.spec.attempt, returncode)
        self._event(child.spec, TaskEventKind.EXITED, pid=proc.pid, exit_code=returncode, detail=child.kill_reason)
        self.records.remove(child.spec.task_id, child.spec.attempt)
        child.done.set()

    def _forget(self, child: _Child) -> None:
        key = (child.spec.task_id, child.spec.attempt)
        with self._lock:
            self._children.pop(key, None)
            _remember(self._finished, key, None)
            _remember(self._tails, child.spec.task_id, child.logs.tail)

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
                _killpg(child.proc.pid, sig)

    # --- reporting --------------------------------------------------------------------------------------------
    def _event(self, spec: LaunchSpec, kind: str, **fields: Any) -> None:
        event = TaskEvent(task_id=spec.task_id, attempt=spec.attempt, kind=kind, **fields)
        if kind in (TaskEventKind.LAUNCH_FAILED, TaskEventKind.PORT_CONFLICT):
            log.warning("task %s attempt %s: %s: %s", spec.task_id, spec.attempt, kind, event.detail)
        try:
            self._send(TASK_EVENT, asdict(event))
        except Exception:  # the outbox never raises; an injected sender might, and must not kill a waiter thread
            log.exception("could not hand on %s for task %s", kind, spec.task_id)


# --- helpers ----------------------------------------------------------------------------------------------------
def child_env(spec: LaunchSpec) -> dict[str, str]:
    """The agent's environment without its secrets, plus the task's own variables and device selection."""
    env = {name: value for name, value in os.environ.items() if not _is_secret(name)}
    env.update(spec.env)
    env.update(
        PYTHONUNBUFFERED="1",
        TFDASH_JOB_ID=str(spec.job_id),
        TFDASH_TASK_ID=str(spec.task_id),
        TFDASH_TASK_TYPE=spec.task_type,
        TFDASH_TASK_INDEX=str(spec.task_index),
        TFDASH_ATTEMPT=str(spec.attempt),
    )
    if spec.gpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.devices))
        env.pop("TFDASH_LOGICAL_CPU_DEVICES", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""  # hide any GPU: a CPU task must not grab one
        env["TFDASH_LOGICAL_CPU_DEVICES"] = str(len(spec.devices))
    # hooks/ first so its sitecustomize runs (it chains to any other); the package root last so
    # `-m worker_agent.runtime` resolves from any cwd without shadowing the user's own modules.
    existing = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(HOOKS_DIR), *existing, str(PACKAGE_ROOT)])
    return env


def _is_secret(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def _validate(spec: LaunchSpec) -> None:
    """launch_spec_from checks shape, not types; these values become paths, argv and env, so check them here."""
    problem = _spec_problem(spec)
    if problem:
        raise _Refused(TaskEventKind.LAUNCH_FAILED, f"malformed launch spec: {problem}")


def _spec_problem(spec: LaunchSpec) -> str:
    for name in ("job_id", "task_id", "attempt", "task_index"):
        if not _is_count(getattr(spec, name)):
            return f"{name} must be a non-negative integer"
    if not isinstance(spec.task_type, str) or not _SAFE_NAME.match(spec.task_type):
        return "task_type must be letters, digits or underscores"
    if spec.port is not None and not (_is_count(spec.port) and 1 <= spec.port <= 65535):
        return "port must be null or 1..65535"
    if not isinstance(spec.devices, list) or not all(_is_count(d) for d in spec.devices):
        return "devices must be a list of non-negative integers"
    if not isinstance(spec.gpu, bool):
        return "gpu must be true or false"
    if not isinstance(spec.env, dict) or not all(_is_str(k) and _is_str(v) for k, v in spec.env.items()):
        return "env must map strings to strings"
    if not isinstance(spec.program.args, list) or not all(isinstance(a, str) for a in spec.program.args):
        return "program args must be a list of strings"
    if not isinstance(spec.job_dir, str) or (spec.job_dir and not os.path.isabs(spec.job_dir)):
        return "job_dir must be empty or an absolute path"
    if not isinstance(spec.kill_grace_s, int | float) or isinstance(spec.kill_grace_s, bool) or spec.kill_grace_s < 0:
        return "kill_grace_s must be a non-negative number"
    return ""


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_port(port: int) -> None:
    """Refuse a port something else holds, before a TF server would crash on it.

    First a plain bind (no SO_REUSEADDR), which fails for any socket on the port. If only that fails, try again with
    SO_REUSEADDR: on Linux that still fails while anything LISTENs on the port, but succeeds when the port is only
    held by TIME_WAIT leftovers of a killed task's connections. TF's gRPC server sets SO_REUSEADDR and starts fine
    then, so a gang restarted on its old ports within a minute must not be refused.
    """
    try:
        _try_bind(port, reuse=False)
    except OSError as plain:
        try:
            _try_bind(port, reuse=True)
        except OSError:
            raise _Refused(TaskEventKind.PORT_CONFLICT, str(plain)) from None
        log.info("port %s: only TIME_WAIT leftovers hold it (%s); launching", port, plain)


def _try_bind(port: int, *, reuse: bool) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))  # noqa: S104 - TF listens on all interfaces, so that is what must be free


def tree_listens_on(pid: int, port: int) -> bool:
    """Whether the process or any of its descendants has a TCP socket LISTENing on `port`."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    for proc in procs:
        try:
            connections = proc.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections):
            return True
    return False


def _wait_for_exit(proc: subprocess.Popen[bytes]) -> None:
    """Block until the child exits, leaving it a zombie so its pid (= its group id) stays reserved until reaped."""
    if hasattr(os, "waitid") and hasattr(os, "WNOWAIT"):
        try:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            return
        except ChildProcessError:  # already reaped elsewhere: Popen.wait copes
            pass
    proc.wait()  # no waitid (macOS): reaped now, so the group kill after it is best effort


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the whole group is already gone
        pass
    except PermissionError as exc:
        log.warning("could not signal process group %s: %s", pgid, exc)


def _skip_rest_of_line(stream: IO[bytes]) -> None:
    while chunk := stream.readline(MAX_LINE_BYTES):
        if chunk.endswith(b"\n"):
            return


def _decode_line(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    if text.endswith("\n"):
        text = text[:-1]
    if text.endswith("\r"):
        text = text[:-1]
    return text[:MAX_LOG_LINE_CHARS]


def _chunks(lines: list[LogLine]) -> list[list[LogLine]]:
    chunks: list[list[LogLine]] = []
    current: list[LogLine] = []
    size = 0
    for line in lines:
        if current and (len(current) >= BATCH_LINES or size + len(line[2]) > BATCH_CHARS):
            chunks.append(current)
            current, size = [], 0
        current.append(line)
        size += len(line[2])
    if current:
        chunks.append(current)
    return chunks


def _remember(table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > KEEP_FINISHED:
        table.popitem(last=False)


def _thread(name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread
