"""Per-worker pace in the coordinator and a worker's own CPU share, on stand-ins for TF's classes (fast; the real
coordinator runs in tests/orchestrator/test_slow_worker_e2e.py): only closures that succeeded count, with the worker
that ran them; a worker that completed none shows 0; an idle window says nothing."""

from __future__ import annotations

import json
import types
from typing import Any

from worker_agent.runtime import worker_pace
from worker_agent.runtime.worker_pace import ProcessLoad, WorkerPace, patch_workers


class Emitter:
    def __init__(self) -> None:
        self.lines: list[tuple[int, dict[str, float]]] = []

    def metric(self, step: int, metrics: dict[str, float], *, epoch: int | None = None, phase: str = "train") -> bool:
        assert phase == "train"
        self.lines.append((step, dict(metrics)))
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_tf_module() -> types.ModuleType:
    """As TF 2.21's cluster_coordinator: a worker's thread runs `_process_closure`, which calls the queue's
    `mark_finished` only when the closure succeeded (a failure is caught and recorded instead)."""
    module = types.ModuleType("fake_cluster_coordinator")

    class Queue:
        def __init__(self) -> None:
            self.finished = 0
            self.errors: list[Exception] = []

        def mark_finished(self) -> None:
            self.finished += 1

    class Worker:
        def __init__(self, index: int, queue: Queue) -> None:
            self.worker_index, self.queue = index, queue
            self._cluster = types.SimpleNamespace(_num_workers=3)

        def _process_closure(self, closure: Any) -> None:
            try:
                closure()
                self.queue.mark_finished()
            except Exception as exc:  # TF records the error on the closure's remote value and the queue
                self.queue.errors.append(exc)

    module.Worker = Worker  # type: ignore[attr-defined]
    module._CoordinatedClosureQueue = Queue  # type: ignore[attr-defined]
    return module


def test_it_counts_each_workers_successful_closures_and_reports_every_worker(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    module = fake_tf_module()
    assert patch_workers(module) and patch_workers(module)  # once: a second call leaves the wrapper alone
    emitter, clock = Emitter(), Clock()
    tracker = WorkerPace(emitter, workers=3, step_offset=10, clock=clock)
    monkeypatch.setattr(worker_pace, "_pace", tracker)
    queue = module._CoordinatedClosureQueue()
    fast, slow = module.Worker(0, queue), module.Worker(1, queue)

    def boom() -> None:
        raise ValueError("a failed closure")

    for _ in range(4):
        fast._process_closure(lambda: None)
    slow._process_closure(lambda: None)
    slow._process_closure(boom)  # failed: not counted
    assert queue.finished == 5 and len(queue.errors) == 1
    clock.now += 2.0
    assert tracker.report(clock.now)

    step, values = emitter.lines[0]
    assert step == 10 + 5
    assert values["worker_steps_per_s/0"] == 2.0 and values["worker_steps_per_s/1"] == 0.5
    assert values["worker_steps_per_s/2"] == 0.0  # known from the cluster, completed nothing: 0, not a gap
    assert "worker_step_time_s/2" not in values and values["worker_step_time_s/0"] >= 0.0
    clock.now += 2.0
    assert not tracker.report(clock.now)  # nothing completed anywhere: no line
    assert len(emitter.lines) == 1


def test_a_module_without_the_private_names_is_left_alone() -> None:
    module = types.ModuleType("other_tf")
    module.Worker = type("Worker", (), {})  # type: ignore[attr-defined]
    assert not patch_workers(module)


def test_a_workers_cpu_share_is_of_the_whole_host_and_idle_windows_say_nothing() -> None:
    emitter, clock = Emitter(), Clock()
    used = {"s": 0.0}
    load = ProcessLoad(emitter, cpus=2, clock=clock, cpu_time=lambda: used["s"])
    clock.now += 2.0
    used["s"] += 1.0  # half a core for 2 s: 25 % of a 2-core host
    assert load.report()
    clock.now += 2.0
    used["s"] += 0.1  # 5 % of one core: idle (a hung worker must not look busy to hang detection)
    assert not load.report()
    assert emitter.lines == [(1, {"process_cpu_percent": 25.0})]


def test_only_a_task_of_a_distributed_job_reports_its_cpu(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    started: list[Any] = []

    def start(self: ProcessLoad) -> None:
        started.append(self)

    monkeypatch.setattr(ProcessLoad, "start", start)
    monkeypatch.setattr(worker_pace, "_load_started", False)
    config = {"cluster": {"worker": ["a:1"], "ps": ["b:1"], "chief": ["c:1"]}}
    alone = {"TFDASH_METRICS_FD": "3", "TF_CONFIG": json.dumps({**config, "task": {}})}
    assert not worker_pace.start_process_load(alone)
    assert not worker_pace.start_process_load({"TFDASH_METRICS_FD": "3"})
    assert not worker_pace.start_process_load({"TF_CONFIG": "not json", "TFDASH_METRICS_FD": "3"})
    worker = {**alone, "TF_CONFIG": json.dumps({**config, "task": {"type": "worker", "index": 0}})}
    assert not worker_pace.start_process_load({k: v for k, v in worker.items() if k != "TFDASH_METRICS_FD"})
    assert worker_pace.start_process_load(worker)
    assert not worker_pace.start_process_load(worker)  # once per process
    assert len(started) == 1
