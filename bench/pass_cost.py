"""What one scheduler pass costs at fleet size, in-process: the idle fleet's first pass over a full queue, then the
steady state bench/scale.py spends most passes in (a busy fleet, one gang ends, a pass places what now fits).

Real PostgreSQL and Redis (embedded, under a temporary folder), no agents and no Celery worker: the pass runs here, so
its time is the scheduler's own (queue read, host load, capacity, placement, writes, commit). Prints, per phase, the
passes, tasks placed, pass time p50/p99 and tasks/s within the passes; `--profile` adds a cProfile of each phase.
Checks the rows the passes wrote (no port or device held twice on a host, every job placed once with all its tasks)
and exits 1 when a check fails.

    .venv/bin/python bench/pass_cost.py [--hosts 500] [--jobs 1000] [--ends 60] [--per-pass 1] [--seed 14]
                                        [--packing spread|pack] [--history N] [--drawn-limits]
                                        [--profile [--sort cumulative|tottime]]

`--per-pass K` ends K gangs before each steady pass: bench/scale.py's passes place what a few seconds of endings
freed (a pass at most every TFDASH_SCHEDULE_INTERVAL_S), dozens of jobs each, not one gang's worth.
`--drawn-limits` gives the jobs time limits as bench/scale.py does (1.5-5x a drawn run time; without it every job has
the cluster's default limit, so running gangs end together and reservations are cheap to plan). `--history N` adds N
finished jobs (copies of a placed one, with its tasks) before the steady passes: a fleet a team
has used for months keeps every job it ran, and a pass must not slow down with them.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scale import expected_tasks, give_time_limits, job_mix, pct, register_fleet  # noqa: E402
from stack import django_in_process  # noqa: E402

GPUS_PER_HOST = 8


def bring_online(hosts: int) -> None:
    from django.utils import timezone

    from orchestrator.models import Host, HostStatus

    gpus = [{"index": i, "name": "Simulated H100", "memory_total_mb": 81_559, "uuid": f"GPU-{i}"}
            for i in range(GPUS_PER_HOST)]  # fmt: skip
    Host.objects.update(status=HostStatus.ONLINE, last_heartbeat=timezone.now(), gpus=gpus, cpu_count=64)
    assert Host.objects.filter(status=HostStatus.ONLINE).count() == hosts


def queue_jobs(shapes: list[dict[str, Any]]) -> None:
    """The queue, written directly (bench/scale.py measures submission; here only passes are timed)."""
    from django.contrib.auth import get_user_model

    from orchestrator.models import Cluster, Job, JobState

    owner = get_user_model().objects.create_user("pass-cost")
    cluster = Cluster.objects.get(name="scale")
    Job.objects.bulk_create(
        [
            Job(
                owner=owner,
                cluster=cluster,
                name=s["name"],
                strategy=s["strategy"],
                program_kind="builtin",
                builtin="digits_mlp",
                workers=s["workers"],
                ps=s.get("ps", 0),
                devices_per_worker=s["devices_per_worker"],
                state=JobState.QUEUED,
            )
            for s in shapes
        ],
        batch_size=1000,
    )


def end_one_job(rng: random.Random) -> int | None:
    """A running gang finishes (as its agents would report): its tasks end, the job succeeds. Returns its id."""
    from django.utils import timezone

    from orchestrator.models import ACTIVE_TASK_STATES, Job, JobState, Task, TaskState

    running = list(Job.objects.filter(state=JobState.STARTING).values_list("pk", flat=True)[:200])
    if not running:
        return None
    job_id = rng.choice(running)
    now = timezone.now()
    Task.objects.filter(job_id=job_id, state__in=ACTIVE_TASK_STATES).update(
        state=TaskState.SUCCEEDED, exit_code=0, finished_at=now
    )
    Job.objects.filter(pk=job_id).update(state=JobState.SUCCEEDED, finished_at=now)
    return job_id


def add_history(jobs: int) -> None:
    """`jobs` finished jobs with their tasks, copied in SQL from a job the first pass placed (its columns as they are,
    the state succeeded, created earlier than the queue)."""
    from django.db import connection

    from orchestrator.models import Job, JobState, Task, TaskState

    template = Job.objects.filter(attempt=1).order_by("pk").values_list("pk", flat=True).first()
    assert template is not None, "the first pass placed nothing"
    job_cols = [f.column for f in Job._meta.concrete_fields if f.column != "id"]
    task_cols = [f.column for f in Task._meta.concrete_fields if f.column not in ("id", "job_id")]
    override = {
        "state": "%(job_state)s",
        "created_at": "created_at - interval '1 day' * n / 100",
        "finished_at": "created_at",
        "name": "name || '-' || n",
    }
    picked = ", ".join(override.get(c, c) for c in job_cols)
    task_picked = ", ".join("%(task_state)s" if c == "state" else f"t.{c}" for c in task_cols)
    jobs_sql = f"""
        INSERT INTO {Job._meta.db_table} ({", ".join(job_cols)}) SELECT {picked}
        FROM {Job._meta.db_table}, generate_series(1, %(n)s) n WHERE id = %(id)s
    """  # noqa: S608 - names from the models, every value a parameter
    tasks_sql = f"""
        INSERT INTO {Task._meta.db_table} (job_id, {", ".join(task_cols)}) SELECT j.id, {task_picked}
        FROM {Job._meta.db_table} j, {Task._meta.db_table} t
        WHERE j.state = %(job_state)s AND j.name LIKE %(like)s AND t.job_id = %(id)s
    """  # noqa: S608 - names from the models, every value a parameter
    like = Job.objects.get(pk=template).name.replace("%", r"\%").replace("_", r"\_") + "-%"
    with connection.cursor() as cursor:
        cursor.execute(jobs_sql, {"job_state": str(JobState.SUCCEEDED), "n": jobs, "id": template})
        cursor.execute(tasks_sql, {"task_state": str(TaskState.SUCCEEDED), "job_state": str(JobState.SUCCEEDED),
                                   "id": template, "like": like})  # fmt: skip
        cursor.execute("ANALYZE")  # as autovacuum would have, over months


def timed_pass(cluster_id: int, profiler: cProfile.Profile | None) -> tuple[int, float]:
    from orchestrator.models import Task
    from orchestrator.scheduler import scheduling

    before = Task.objects.count()
    if profiler is not None:
        profiler.enable()
    began = time.perf_counter()
    scheduling.schedule_cluster(cluster_id)
    took = time.perf_counter() - began
    if profiler is not None:
        profiler.disable()
    return Task.objects.count() - before, took


def check() -> list[str]:
    """What a pass must never do, from the rows it wrote: a port or device held twice on a host by active tasks, a job
    placed with the wrong number of tasks or more than once."""
    from django.db.models import Count

    from orchestrator.models import ACTIVE_TASK_STATES, Job, Task

    failures = []
    held: set[tuple[int, str, int]] = set()
    for host_id, port, devices in Task.objects.filter(state__in=ACTIVE_TASK_STATES).values_list(
        "host_id", "port", "devices"
    ):
        for what, value in [("port", port), *(("device", d) for d in devices or ())]:
            if value is None:
                continue
            if (host_id, what, value) in held:
                failures.append(f"host {host_id}: {what} {value} booked twice")
            held.add((host_id, what, value))
    for job in Job.objects.filter(attempt__gt=0).annotate(n=Count("tasks")):
        expected = expected_tasks({"strategy": job.strategy, "workers": job.workers, "ps": job.ps})
        if job.attempt != 1 or job.n != expected:
            failures.append(f"job {job.pk}: attempt {job.attempt}, {job.n} task(s) for {expected}")
    return failures


def report(name: str, passes: list[tuple[int, float]]) -> None:
    placing = [(n, s) for n, s in passes if n]
    times = [s for _n, s in passes]
    tasks = sum(n for n, _s in placing)
    rate = tasks / sum(s for _n, s in placing) if placing else float("nan")
    print(f"{name:<34} passes {len(passes):>4}  placing {len(placing):>4}  tasks {tasks:>5}  "
          f"pass p50 {pct(times, 50) * 1000:7.1f} ms  p99 {pct(times, 99) * 1000:7.1f} ms  "
          f"tasks/s within placing passes {rate:8.0f}", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--ends", type=int, default=60, help="gangs ended in the steady phase")
    parser.add_argument("--per-pass", type=int, default=1, help="gangs ended before each steady pass")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--packing", choices=("spread", "pack"), default="spread", help="the cluster's packing")
    parser.add_argument("--history", type=int, default=0, help="finished jobs in the database (steady passes)")
    parser.add_argument("--drawn-limits", action="store_true", help="time limits drawn as bench/scale.py draws them")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", choices=("cumulative", "tottime"), default="cumulative", help="the profile's order")
    args = parser.parse_args()
    failures: list[str] = ["did not finish"]
    with django_in_process("tfdash-pass-cost-"):
        from config.celery import freeze_startup_heap
        from orchestrator.models import Cluster, Job

        register_fleet(args.hosts, args.packing)
        bring_online(args.hosts)
        queue_jobs(job_mix(args.jobs, random.Random(args.seed), gpus=args.hosts * GPUS_PER_HOST))
        if args.drawn_limits:
            # Time limits as bench/scale.py gives them (its default durations): running gangs end at many distinct
            # times, which is what a reservation walks (with the cluster's one default limit, they end together).
            ids = sorted(Job.objects.values_list("pk", flat=True))
            give_time_limits(ids, (20.0, 60.0), random.Random(args.seed + 1))
        cluster_id = Cluster.objects.get(name="scale").pk
        freeze_startup_heap()  # as the orchestrator worker does once it is ready (config/celery.py)
        print(f"[pass-cost] {args.hosts} hosts x {GPUS_PER_HOST} GPUs, {args.jobs} jobs queued", flush=True)

        first = cProfile.Profile() if args.profile else None
        report("first pass (idle fleet, full queue)", [timed_pass(cluster_id, first)])
        if args.history:
            add_history(args.history)
            print(f"[pass-cost] {args.history} finished jobs added", flush=True)
        rng = random.Random(args.seed)
        profiler = cProfile.Profile() if args.profile else None
        steady = []
        per_pass = max(1, args.per_pass)
        for _ in range(args.ends // per_pass):
            if None in [end_one_job(rng) for _ in range(per_pass)]:
                break  # nothing left running
            steady.append(timed_pass(cluster_id, profiler))
        report(f"steady ({per_pass} gang(s) end, one pass)", steady)
        if steady:
            print(f"[pass-cost] steady passes: mean {statistics.mean(s for _n, s in steady) * 1000:.1f} ms", flush=True)
        failures = check()
        print(f"[pass-cost] failures: {failures[:10] or 'none'}", flush=True)
        for name, prof in (("first pass", first), ("steady passes", profiler)):
            if prof is not None:
                stats = io.StringIO()
                pstats.Stats(prof, stream=stats).sort_stats(args.sort).print_stats(40)
                print(f"[pass-cost] profile of the {name}:\n{stats.getvalue()}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
