"""What reading usage costs at 1,000,000 tasks (issue 46: "per user per day over 90 days in well under a second"):
the usage API's own read (orchestrator/usage/reads.py `read`), timed in-process against a real PostgreSQL.

Real PostgreSQL and Redis (embedded, under a temporary folder, as bench/pass_cost.py has them), migrated, then filled
in SQL: `--users` users in `--groups` groups, four clusters (two of GPU hosts, two of CPU, two with a price),
`--tasks` ended tasks of four per job spread over the last 365 days (1 to 8 devices each, running up to 12 hours,
many across a UTC midnight), plus `--running` tasks still running, and the daily rollup those ended tasks produce
(each split at UTC midnights, summed per day, cluster, owner and kind, as orchestrator/usage/recording.py adds them at
each end). The bench checks that the rollup holds every ended task's device-seconds, then times, each `--runs` times
after one warm-up read (the median and the slowest printed):

- per user per day over the last 90 days, as staff see it (every user): the acceptance's query;
- the same as a user sees it (their own and their group's members');
- per group per day over the last 90 days, as staff see it.

It also prints how PostgreSQL finds the running tasks (the partial index `task_usage_pending`, never a scan of the
million task rows) and exits 1 when a check fails. From a fresh shell, in a checkout:

    make install                       # once: the venv (.venv) with the embedded PostgreSQL and Redis wheels
    .venv/bin/python bench/usage_query.py [--tasks 1000000] [--users 200] [--groups 20] [--running 200] [--runs 7]

Filling a million tasks takes a few minutes on a 2-core machine; the reads are what is timed.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stack import django_in_process  # noqa: E402

TASKS_PER_JOB = 4
CLUSTERS = (("gpu-a", "3.0000"), ("gpu-b", None), ("cpu-a", "0.2000"), ("cpu-b", None))


def insert_series(model: Any, count: int, exprs: dict[str, str], params: list[Any] | None = None) -> None:
    """`count` rows of `model` in one INSERT ... SELECT over generate_series(1, count) AS g: the columns in `exprs`
    are those SQL expressions (of g; no `%`: the values are parameters), every other one the model's default,
    prepared as Django prepares it."""
    from django.db import connection

    blank = model()
    columns, values, constants = [], [], []
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(field.column)
        if field.column in exprs:
            values.append(exprs[field.column])
        else:
            values.append("%s")
            constants.append(field.get_db_prep_save(field.pre_save(blank, add=True), connection))
    sql = (
        f"INSERT INTO {model._meta.db_table} ({', '.join(columns)}) "  # noqa: S608 - names from the model
        f"SELECT {', '.join(values)} FROM generate_series(1, {int(count)}) AS g"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*constants, *(params or [])])


def fill(tasks: int, users: int, groups: int, running: int) -> None:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.db import connection, transaction

    from orchestrator.models import Cluster, Job, Task, UsageDay

    User = get_user_model()
    with transaction.atomic():
        User.objects.bulk_create(User(username=f"user{n:04d}") for n in range(users))
        Group.objects.bulk_create(Group(name=f"team{n:02d}") for n in range(groups))
        user_ids = sorted(User.objects.values_list("pk", flat=True))
        group_ids = sorted(Group.objects.values_list("pk", flat=True))
        through = User.groups.through
        through.objects.bulk_create(
            through(user_id=pk, group_id=group_ids[n % groups]) for n, pk in enumerate(user_ids)
        )
        for name, price in CLUSTERS:
            Cluster.objects.create(name=name, price_per_device_hour=price)
        clusters = sorted(Cluster.objects.values_list("pk", flat=True))
        jobs = tasks // TASKS_PER_JOB + running
        with connection.cursor() as cursor:
            cursor.execute("SELECT setseed(0.46)")
        # Owners drawn unevenly (a few heavy users), clusters in turn.
        insert_series(Job, jobs, {
            "owner_id": f"(ARRAY{user_ids})[1 + floor(power(random(), 2) * {len(user_ids)})::int]",
            "cluster_id": f"(ARRAY{clusters})[1 + mod(g, {len(clusters)})]",
            "state": "'succeeded'",
            "name": "'bench'",
        })  # fmt: skip
        first_job = Job.objects.order_by("pk").values_list("pk", flat=True).first()
        devices = "(ARRAY['[0]', '[0, 1]', '[0, 1, 2, 3]', '[0, 1, 2, 3, 4, 5, 6, 7]']::jsonb[])"
        start = "(date_trunc('day', now()) - interval '364 days')"
        ended = tasks // TASKS_PER_JOB * TASKS_PER_JOB
        insert_series(Task, ended, {
            "job_id": f"{first_job} + (g - 1) / {TASKS_PER_JOB}",
            "type": "'worker'",
            "index": f"mod(g - 1, {TASKS_PER_JOB})",
            "devices": f"{devices}[1 + floor(random() * 4)::int]",
            "state": "'succeeded'",
            "placed_at": f"{start} + random() * (now() - {start} - interval '12 hours')",
            "usage_recorded": "true",
        })  # fmt: skip
        with connection.cursor() as cursor:
            # Each ran up to 12 hours from its placement.
            cursor.execute(f"UPDATE {Task._meta.db_table} SET started_at = placed_at, "  # noqa: S608
                           "finished_at = placed_at + random() * interval '12 hours'")  # fmt: skip
        insert_series(Task, running, {
            "job_id": f"{first_job} + {jobs - running} + g - 1",
            "type": "'worker'",
            "index": "0",
            "devices": f"{devices}[1 + floor(random() * 4)::int]",
            "state": "'running'",
            "placed_at": "now() - random() * interval '30 hours'",
        })  # fmt: skip
        rollup(Task, Job, Cluster, UsageDay)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def rollup(Task: Any, Job: Any, Cluster: Any, UsageDay: Any) -> None:
    """The rollup the ended tasks produce: each split at UTC midnights, summed per day, cluster, owner and kind."""
    from django.db import connection

    sql = f"""
        INSERT INTO {UsageDay._meta.db_table} (day, cluster_id, user_id, kind, device_seconds, tasks)
        SELECT d.day::date, j.cluster_id, j.owner_id,
               CASE WHEN c.name LIKE 'gpu%%' THEN 'gpu' ELSE 'cpu' END,
               SUM(jsonb_array_length(t.devices) * extract(epoch FROM
                   least(t.finished_at, (d.day + interval '1 day') AT TIME ZONE 'UTC')
                   - greatest(t.placed_at, d.day AT TIME ZONE 'UTC'))),
               COUNT(*)
        FROM {Task._meta.db_table} t
        JOIN {Job._meta.db_table} j ON j.id = t.job_id
        JOIN {Cluster._meta.db_table} c ON c.id = j.cluster_id
        CROSS JOIN LATERAL generate_series(date_trunc('day', t.placed_at AT TIME ZONE 'UTC'),
                                           t.finished_at AT TIME ZONE 'UTC', interval '1 day') AS d(day)
        WHERE t.usage_recorded AND t.finished_at > t.placed_at
          AND (d.day AT TIME ZONE 'UTC') < t.finished_at
        GROUP BY 1, 2, 3, 4
    """  # noqa: S608 - table names from the models
    with connection.cursor() as cursor:
        cursor.execute(sql)


def check_rollup() -> list[str]:
    from django.db import connection

    from orchestrator.models import Task, UsageDay

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT SUM(jsonb_array_length(devices) * extract(epoch FROM finished_at - placed_at)) "  # noqa: S608
            f"FROM {Task._meta.db_table} WHERE usage_recorded"
        )
        (from_tasks,) = cursor.fetchone()
        cursor.execute(f"SELECT SUM(device_seconds), COUNT(*) FROM {UsageDay._meta.db_table}")  # noqa: S608
        in_rollup, rows = cursor.fetchone()
    print(f"rollup: {rows:,} rows for {Task.objects.filter(usage_recorded=True).count():,} ended tasks; "
          f"{in_rollup:,.0f} device-seconds, the tasks' own sum {float(from_tasks):,.0f}")  # fmt: skip
    if abs(in_rollup - float(from_tasks)) > 1e-6 * float(from_tasks):
        return ["the rollup does not hold the tasks' device-seconds"]
    return []


def timed(what: str, read: Any, runs: int) -> float:
    read()  # warm: the plan cached, the pages in memory
    times, cpu = [], []
    for _ in range(runs):
        began, began_cpu = time.perf_counter(), time.process_time()
        report = read()
        times.append((time.perf_counter() - began) * 1000)
        cpu.append((time.process_time() - began_cpu) * 1000)
    median = statistics.median(times)
    # This process's CPU (psycopg reading the rows, the Python around it) apart from the wall time, which also holds
    # PostgreSQL's work and, on a shared machine, waiting for a core.
    print(f"{what}: median {median:.1f} ms, slowest {max(times):.1f} ms over {runs} runs; this process's CPU median "
          f"{statistics.median(cpu):.1f} ms ({len(report.rows):,} rows of day x account x kind, "
          f"{len(report.accounts)} accounts)")  # fmt: skip
    return median


def server_time(query: Any, scope: Any) -> str:
    """PostgreSQL's own time for the rollup query (EXPLAIN ANALYZE's execution time)."""
    from django.db import connection

    from orchestrator.usage import reads

    sql, params = reads._rollup_sql(query, scope, reads.Filters())
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, TIMING OFF) {sql}", params)
        return next(line for (line,) in cursor.fetchall() if line.startswith("Execution Time"))


def running_plan() -> str:
    from django.db import connection

    from orchestrator.models import ACTIVE_TASK_STATES, Task

    query = Task.objects.filter(state__in=ACTIVE_TASK_STATES, usage_recorded=False).values_list("placed_at").query
    sql, params = query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}", params)
        return " / ".join(line.strip() for (line,) in cursor.fetchall() if "Scan" in line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--running", type=int, default=200)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print(
        f"machine: {os.cpu_count()} CPUs ({platform.machine()}, {platform.processor() or platform.platform()}); "
        f"load average {os.getloadavg()[0]:.1f} at the start"
    )
    with django_in_process("tfdash-usage-query-"):
        from django.contrib.auth import get_user_model
        from django.utils import timezone

        from orchestrator.usage import reads, scopes
        from orchestrator.usage.periods import Query

        began = time.perf_counter()
        fill(args.tasks, args.users, args.groups, args.running)
        print(f"filled {args.tasks:,} ended and {args.running} running tasks in {time.perf_counter() - began:.0f} s")
        problems = check_rollup()
        now = timezone.now()
        today = now.date()
        last_90 = Query(start=today - timedelta(days=89), end=today, by="user")
        member = get_user_model().objects.filter(groups__isnull=False).order_by("pk").first()
        as_member = scopes.scope_of(member)
        everyone = reads.Filters()
        timed(
            "per user per day, 90 days, staff", lambda: reads.read(last_90, scopes.EVERYONE, everyone, now), args.runs
        )
        print(f"  its rollup query in PostgreSQL alone: {server_time(last_90, scopes.EVERYONE)}")
        timed("per user per day, 90 days, a group member", lambda: reads.read(last_90, as_member, everyone, now),
              args.runs)  # fmt: skip
        by_group = Query(start=last_90.start, end=today, by="group")
        timed("per group per day, 90 days, staff", lambda: reads.read(by_group, scopes.EVERYONE, everyone, now),
              args.runs)  # fmt: skip
        plan = running_plan()
        print(f"running tasks read by: {plan}")
        if "task_usage_pending" not in plan:
            problems.append("the running tasks are not read through the partial index task_usage_pending")
        total = reads.read(last_90, scopes.EVERYONE, everyone, now)
        if not total.accounts or not any(a.running_seconds for a in total.accounts):
            problems.append("the read counted no running task")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
