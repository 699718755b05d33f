"""What applying the agents' task events costs the orchestrator, in-process: SQL statements and milliseconds per event.

At fleet size most of the orchestrator's time is task events (a gang's STARTED, LISTENING and EXITED, per task; the
scale bench's orchestrator spent half its samples in them): this is that path alone, measured. Real PostgreSQL and
Redis (embedded, under a temporary folder), no agents and no Celery worker: `--jobs` gangs of bench/scale.py's mix are
placed by a real scheduler pass on an idle `--hosts` fleet, then every task's events, sealed by its host's key as its
agent seals them, go through `handle_task_events` in batches as the intake applies them (a gang's events together),
phase by phase. Prints, per phase, events, statements per event (counted at the database connection: what the
machine does not change), wall and CPU milliseconds per event (the CPU of this thread: what the orchestrator's one
process pays) and events/s. Checks that every event was applied and every job ended `succeeded` with every task, and
exits 1 when not.

    .venv/bin/python bench/event_cost.py [--hosts 100] [--jobs 200] [--seed 14]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pass_cost import GPUS_PER_HOST, bring_online, queue_jobs  # noqa: E402
from scale import job_mix, register_fleet  # noqa: E402
from stack import django_in_process  # noqa: E402

BATCH = 50  # orchestrator/agents/events.py MAX_BATCH: what the intake applies at once (orchestrator/agents/intake.py)


class Statements:
    """Counts the statements sent on Django's connection (connection.execute_wrapper)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.count += 1
        return execute(sql, params, many, context)


def phase_events(fleet: dict[str, str], kind: str, seq: dict[str, int]) -> list[dict[str, Any]]:
    """Every current task's `kind` event, as its host's agent seals it, in job order (a gang's events together)."""
    from contracts.protocol import TASK_EVENT
    from contracts.signing import agent_mac_key, seal
    from contracts.task_messages import TaskEvent, TaskEventKind
    from orchestrator.models import Task

    out = []
    rows = Task.objects.order_by("job_id", "pk").values_list("pk", "attempt", "host__name", "job__strategy")
    for task_id, attempt, host, strategy in rows:
        if kind == TaskEventKind.LISTENING and strategy == "mirrored":
            continue  # no TF server, nothing listens
        fields: dict[str, Any] = {"pid": 1000 + task_id}
        if kind == TaskEventKind.EXITED:
            fields["exit_code"] = 0
        seq[host] += 1
        body = TaskEvent(task_id, attempt, kind, seq=seq[host], **fields)
        out.append(seal(agent_mac_key(fleet[host], host), host, TASK_EVENT, asdict(body)))
    return out


def apply(events: list[dict[str, Any]]) -> tuple[int, int, float, float]:
    """(events applied, statements, seconds, seconds of this thread's CPU) of applying `events` in intake-sized
    batches. The CPU time is the orchestrator's own (its worker is one process, bound by one core at fleet size); the
    wall time adds PostgreSQL's and whatever else the machine ran."""
    from django.db import connection

    from orchestrator.agents.events import handle_task_events

    counted = Statements()
    applied = 0
    with connection.execute_wrapper(counted):
        began, cpu = time.perf_counter(), time.thread_time()
        for i in range(0, len(events), BATCH):
            applied += handle_task_events(events[i : i + BATCH])
        took, cpu = time.perf_counter() - began, time.thread_time() - cpu
    return applied, counted.count, took, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=14)
    args = parser.parse_args()
    failures: list[str] = ["did not finish"]
    with django_in_process("tfdash-event-cost-"):
        from contracts.task_messages import TaskEventKind
        from orchestrator.models import Cluster, Job, JobState, Task, TaskState
        from orchestrator.scheduler import scheduling

        fleet = {entry["name"]: entry["token"] for entry in register_fleet(args.hosts)}
        bring_online(args.hosts)
        queue_jobs(job_mix(args.jobs, random.Random(args.seed), gpus=args.hosts * GPUS_PER_HOST))
        scheduling.schedule_cluster(Cluster.objects.get(name="scale").pk)
        Job.objects.filter(state=JobState.QUEUED).delete()  # what did not fit the idle fleet is not measured
        jobs, tasks = Job.objects.count(), Task.objects.count()
        print(f"[event-cost] {args.hosts} hosts x {GPUS_PER_HOST} GPUs: {jobs} gangs placed, {tasks} tasks", flush=True)
        seq = dict.fromkeys(fleet, 0)
        total_events = total_statements = 0
        total_s = total_cpu = 0.0
        missed: list[str] = []
        for kind in (TaskEventKind.STARTED, TaskEventKind.LISTENING, TaskEventKind.EXITED):
            events = phase_events(fleet, kind, seq)
            applied, statements, took, cpu = apply(events)
            if applied != len(events):  # every event is new: one not applied was dropped or its handler failed
                missed.append(f"{len(events) - applied} {kind} event(s) not applied")
            total_events += applied
            total_statements += statements
            total_s += took
            total_cpu += cpu
            print(f"{kind:<10} events {len(events):>6}  applied {applied:>6}  statements/event "
                  f"{statements / max(applied, 1):6.2f}  ms/event {took / max(applied, 1) * 1000:6.2f}  "
                  f"CPU ms/event {cpu / max(applied, 1) * 1000:6.2f}  events/s {applied / took:8.0f}",
                  flush=True)  # fmt: skip
        print(f"{'all':<10} events {total_events:>6}  statements/event {total_statements / max(total_events, 1):6.2f}"
              f"  ms/event {total_s / max(total_events, 1) * 1000:6.2f}  CPU ms/event "
              f"{total_cpu / max(total_events, 1) * 1000:6.2f}  events/s {total_events / total_s:8.0f}")  # fmt: skip
        failures = missed + [f"job {pk} {state}" for pk, state in Job.objects.exclude(state=JobState.SUCCEEDED)
                             .values_list("pk", "state")[:10]]  # fmt: skip
        unfinished = Task.objects.exclude(state__in=(TaskState.SUCCEEDED, TaskState.KILLED)).count()
        if unfinished:
            failures.append(f"{unfinished} task(s) not ended")
        print(f"[event-cost] failures: {failures or 'none'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
