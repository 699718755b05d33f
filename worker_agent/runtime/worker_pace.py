"""Each ParameterServer worker's own pace, measured in the coordinator; each worker process's own CPU share.

ParameterServer workers are asynchronous: the coordinator (the chief) hands each scheduled function (a closure) to
whichever worker's thread takes it next, so a slow worker completes fewer closures while the others carry on. TF runs
one thread per worker in the coordinator (`Worker._process_queue` -> `Worker._process_closure`, TF 2.21's
cluster_coordinator.py); `_process_closure` returns once its closure ran on that worker and its result was copied
back (the worker's executor is synchronous), or once it failed. `patch_workers(module)` wraps it, and
`_CoordinatedClosureQueue.mark_finished` (called only on success, on that same thread) marks the closure as done:
a closure that failed, was put back (a transient error, a worker lost and recovered) or was cancelled is not
counted. This sees every closure whoever scheduled it: tf_keras `Model.fit` under ParameterServerStrategy (one
closure per `steps_per_execution` steps, evaluation's too) and a custom `ClusterCoordinator.schedule` loop alike.

What the coordinator reports, every WINDOW_S (2 s) in which at least one closure completed, as one phase "train"
metric line whose step is the number of closures completed so far (after the process's last reported step):
- `worker_steps_per_s/<i>`: closures worker i completed in the window / the window's seconds (0 for a worker that
  completed none: a stalled worker shows as 0, not as a gap);
- `worker_step_time_s/<i>`: the mean seconds worker i spent on each of them (absent when it completed none).
A window in which no closure completed anywhere (start-up, between fits, the end) is not reported: nothing to compare.

What each task process of a distributed job reports (any process whose TF_CONFIG names its task: worker, chief, ps),
every WINDOW_S: its own CPU time over the window as a share of the host's whole CPU capacity, `process_cpu_percent`
(the same scale as the host samples' `cpu_percent`: 100 = every core busy), so the control plane can tell a host busy
with this job's tasks from one busy with other processes. Only windows in which the process used at least
MIN_REPORTED_CPU_PERCENT of one core are reported: an idle process says nothing, so a hung job (its tasks wait, they
do not compute) still looks hung to the product's hang detection, which counts any new point as progress.

Cost: on each worker thread of the coordinator two clock reads and one lock-held addition per closure; one daemon
thread per process wakes every WINDOW_S. Any failure in here disables the counting (one line on stderr); the user's
program runs on. The names read from TF's module (`Worker._process_closure`, `_CoordinatedClosureQueue.mark_finished`)
are private: on a TensorFlow without them nothing is patched and nothing is reported (tests/worker_agent/runtime/
test_worker_pace.py runs the real coordinator against TF's own in-process cluster).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from worker_agent.runtime.emitter import Emitter, get_emitter
from worker_agent.runtime.metrics import last_step

WINDOW_S = 2.0
MIN_REPORTED_CPU_PERCENT = 10.0  # of one core, over a window
PACE_METRIC = "worker_steps_per_s/"
STEP_TIME_METRIC = "worker_step_time_s/"
CPU_METRIC = "process_cpu_percent"

_pace: WorkerPace | None = None
_pace_lock = threading.Lock()
_on_thread = threading.local()
_failed = False


def patch_workers(module: ModuleType) -> bool:
    """Wrap the module's per-worker closure processing (once); True when it is wrapped now or already was."""
    worker = getattr(module, "Worker", None)
    queue = getattr(module, "_CoordinatedClosureQueue", None)
    if not callable(getattr(worker, "_process_closure", None)) or not callable(getattr(queue, "mark_finished", None)):
        _warn(f"{module.__name__} has no Worker._process_closure: per-worker pace is not reported")
        return False
    if getattr(worker._process_closure, "_tfdash_patched", False):
        return True
    queue.mark_finished = _wrap_mark_finished(queue.mark_finished)
    worker._process_closure = _wrap_process_closure(worker._process_closure)
    return True


def _wrap_mark_finished(mark_finished: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(mark_finished)
    def patched_mark_finished(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = mark_finished(self, *args, **kwargs)
        _on_thread.finished = True  # this worker thread's closure succeeded (TF calls it on no other path)
        return result

    return patched_mark_finished


def _wrap_process_closure(process_closure: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(process_closure)
    def patched_process_closure(self: Any, closure: Any) -> Any:
        if _failed:
            return process_closure(self, closure)
        _on_thread.finished = False
        started = time.monotonic()
        try:
            return process_closure(self, closure)
        finally:
            if _on_thread.finished:
                try:
                    pace(self).completed(int(self.worker_index), time.monotonic() - started)
                except Exception as exc:  # never stand between the user and their training
                    _disable(exc)

    patched_process_closure._tfdash_patched = True  # type: ignore[attr-defined]
    return patched_process_closure


def pace(worker: Any) -> WorkerPace:
    """The process's one WorkerPace (the coordinator is one per process), started by the first completed closure."""
    global _pace
    if _pace is None:
        with _pace_lock:
            if _pace is None:
                workers = getattr(getattr(worker, "_cluster", None), "_num_workers", 0)
                started = WorkerPace(get_emitter(), workers=int(workers or 0), step_offset=last_step())
                started.start()
                _pace = started
    return _pace


class WorkerPace:
    """Closures completed per worker and their seconds, reported every `window_s` from its own thread."""

    def __init__(
        self,
        emitter: Emitter,
        *,
        workers: int = 0,
        step_offset: int = 0,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.emitter = emitter
        self.workers = workers  # known from the cluster; indexes seen beyond it are added
        self.step_offset = step_offset
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()  # guards the window's counts, written by every worker thread
        self._counts: dict[int, int] = {}
        self._seconds: dict[int, float] = {}
        self._window_t0 = clock()
        self.done = 0
        self.reports = 0

    def completed(self, worker_index: int, seconds: float) -> None:
        with self._lock:
            self._counts[worker_index] = self._counts.get(worker_index, 0) + 1
            self._seconds[worker_index] = self._seconds.get(worker_index, 0.0) + seconds

    def start(self) -> None:
        threading.Thread(target=self._run, name="tfdash-worker-pace", daemon=True).start()

    def _run(self) -> None:
        try:
            while True:
                time.sleep(self.window_s)
                self.report(self._clock())
        except Exception as exc:
            _disable(exc)

    def report(self, now: float) -> bool:
        """Close the window at `now`: one line when any closure completed in it; True when a line was written."""
        with self._lock:
            counts, seconds = self._counts, self._seconds
            self._counts, self._seconds = {}, {}
            elapsed, self._window_t0 = now - self._window_t0, now
        total = sum(counts.values())
        if not total or elapsed <= 0:
            return False
        self.done += total
        indexes = set(range(self.workers)) | set(counts)
        values: dict[str, float] = {}
        for index in sorted(indexes):
            count = counts.get(index, 0)
            values[f"{PACE_METRIC}{index}"] = count / elapsed
            if count:
                values[f"{STEP_TIME_METRIC}{index}"] = seconds[index] / count
        self.emitter.metric(self.step_offset + self.done, values, phase="train")
        self.reports += 1
        return True


class ProcessLoad:
    """This process's CPU time per window as a share of the host's CPU capacity (see the module's docstring)."""

    def __init__(
        self,
        emitter: Emitter,
        *,
        window_s: float = WINDOW_S,
        cpus: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpu_time: Callable[[], float] = lambda: sum(os.times()[:2]),
    ) -> None:
        self.emitter = emitter
        self.window_s = window_s
        self.cpus = cpus or os.cpu_count() or 1
        self._clock = clock
        self._cpu_time = cpu_time
        self._last = (clock(), cpu_time())
        self.windows = 0

    def start(self) -> None:
        threading.Thread(target=self._run, name="tfdash-process-load", daemon=True).start()

    def _run(self) -> None:
        try:
            while True:
                time.sleep(self.window_s)
                self.report()
        except Exception as exc:
            _warn(f"process CPU share stopped after an error: {exc!r}")

    def report(self) -> bool:
        now, used = self._clock(), self._cpu_time()
        (then, before), self._last = self._last, (now, used)
        self.windows += 1
        elapsed = now - then
        if elapsed <= 0 or (used - before) / elapsed * 100.0 < MIN_REPORTED_CPU_PERCENT:
            return False
        share = (used - before) / (elapsed * self.cpus) * 100.0
        return self.emitter.metric(self.windows, {CPU_METRIC: min(share, 100.0)}, phase="train")


_load_started = False


def start_process_load(environ: dict[str, str] | None = None) -> bool:
    """Start reporting this process's CPU share when TF_CONFIG names its task (once per process)."""
    global _load_started
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    if _load_started or not environ.get("TFDASH_METRICS_FD"):
        return False
    try:
        task = json.loads(environ.get("TF_CONFIG") or "{}").get("task") or {}
    except (ValueError, AttributeError):
        return False
    if not isinstance(task, dict) or not isinstance(task.get("type"), str) or not task["type"]:
        return False
    _load_started = True
    ProcessLoad(get_emitter()).start()
    return True


def _disable(exc: BaseException) -> None:
    global _failed
    if not _failed:
        _failed = True
        _warn(f"per-worker pace is off after an error: {exc!r}")


def _warn(message: str) -> None:
    print(f"tfdash: {message}", file=sys.stderr, flush=True)
