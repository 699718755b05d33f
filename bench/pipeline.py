"""Live-metrics pipeline, end to end on this machine: latency and sustained ingest.

Real parts: the agent's metrics-pipe reader and outbox (fed JSON lines through an os.pipe, exactly as a TF process
writes them), Redis (the metrics stream), the ingest consumer, PostgreSQL, Channels over Redis, Daphne, and WebSocket
clients signed in with a session. Uses its own database (tfdash_bench) and Redis database 7.

    .venv/bin/python bench/pipeline.py [--jobs 8] [--tasks 4] [--rate 10] [--seconds 20] [--ingest-points 200000]

Prints p50/p95/p99 latency from the TF-side event timestamp to the frame's arrival at a WebSocket client, frames
sent vs received, then sustained ingest in points/s with points sent vs stored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB = "tfdash_bench"

from stack import free_port, local_env, prepare_database, start, wait_line, wait_port  # noqa: E402

# The ingest phase writes all its points to one job: past the per-job point limit (TFDASH_MAX_POINTS_PER_JOB, a
# million) the ingest would thin them by design, and --ingest-points 1000000 would read as points lost.
local_env(DB, 7, TFDASH_MAX_POINTS_PER_JOB=str(10**9))


class FakeTask:
    """A TF process as the agent sees it: JSON lines written to the task's metrics pipe."""

    def __init__(self, task_id: int, send, first_step: int = 0) -> None:  # type: ignore[no-untyped-def]
        from worker_agent.supervision.metrics_pipe import MetricsPipe

        self.pipe = MetricsPipe(task_id, 1, send)
        self.writer = os.fdopen(os.dup(self.pipe.write_fd), "w", buffering=1)
        self.pipe.child_started()
        self.pipe.start(f"bench-{task_id}")
        self.step = first_step  # a later phase must not repeat a step: it would be an update, not a new point

    def emit(self, metrics: dict[str, float]) -> None:
        self.step += 1
        line = {"kind": "metric", "ts": time.time(), "mono": time.monotonic(), "step": self.step, "epoch": 1,
                "phase": "train", "metrics": metrics}  # fmt: skip
        self.writer.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self.writer.close()
        self.pipe.finish(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--rate", type=float, default=10.0, help="events per second per task")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--ingest-points", type=int, default=200_000)
    parser.add_argument("--crowd", type=int, default=50, help="viewers on one job in the crowd phase (0: skip)")
    args = parser.parse_args()

    prepare_database()
    import django

    django.setup()
    from celery import Celery
    from django.contrib.auth import get_user_model
    from django.contrib.sessions.backends.db import SessionStore

    from contracts.signing import agent_mac_key
    from orchestrator.identity import tokens
    from orchestrator.models import Cluster, Host, Job, MetricPoint, Task
    from worker_agent.outbox import Outbox

    user = get_user_model().objects.create_user("bench", password="bench-pass-1", is_staff=True)
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.create()
    cluster = Cluster.objects.create(name="bench")
    hosts, outboxes = [], []
    broker = Celery("bench-agents", broker=os.environ["REDIS_URL"], set_as_current=False)
    for i in range(args.tasks):
        host = Host(
            cluster=cluster, name=f"bench-{i}", address="127.0.0.1", port_min=30000 + i * 10, port_max=30009 + i * 10
        )
        token = tokens.issue(host)
        hosts.append(host)
        outboxes.append(Outbox(broker, host.name, agent_mac_key(token, host.name)))
    jobs, tasks = [], []
    for j in range(args.jobs):
        job = Job.objects.create(owner=user, cluster=cluster, name=f"bench {j}", strategy="multi_worker_mirrored",
                                 program_kind="script", workers=args.tasks, state="running", attempt=1)  # fmt: skip
        jobs.append(job)
        for i, host in enumerate(hosts):
            tasks.append(
                (job, Task.objects.create(job=job, attempt=1, type="worker", index=i, host=host, state="running"))
            )

    port = free_port()
    procs = [
        start("web", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]),
        start("ingest", [sys.executable, "manage.py", "ingest_metrics"]),
    ]
    try:
        wait_port(port)
        wait_line("/tmp/bench-ingest.log", "ready")
        web = psutil.Process(procs[0].pid)
        one_each = [job.pk for job in jobs]
        latency(args, port, session.session_key, tasks, outboxes, one_each, "one viewer per job", 0)
        if args.crowd:
            before = web.memory_info().rss
            crowd = [jobs[0].pk] * args.crowd
            latency(args, port, session.session_key, tasks, outboxes, crowd, f"{args.crowd} viewers on one job", 10**6)
            print(f"crowd: web server memory {before / 2**20:.0f} MiB before, {web.memory_info().rss / 2**20:.0f} MiB "
                  f"with {args.crowd} viewers connected")  # fmt: skip
        ingest_rate(args, tasks, outboxes, MetricPoint)
    finally:
        for proc in procs:
            os.killpg(proc.pid, 9)
        for outbox in outboxes:
            outbox.stop()
    return 0


def latency(args, port, session_key, tasks, outboxes, watch, label, first_step) -> None:  # type: ignore[no-untyped-def]
    """Every job's tasks report at args.rate for args.seconds while a socket is open for each job id in `watch`."""
    import websockets

    received: list[float] = []
    per_job = int(args.tasks * args.rate * args.seconds)
    expected = per_job * len(watch)
    ready = threading.Event()
    stop = threading.Event()

    async def viewer(job_id: int, connected: list[int]) -> None:
        url = f"ws://127.0.0.1:{port}/ws/jobs/{job_id}/"
        headers = {"Cookie": f"sessionid={session_key}"}
        async with websockets.connect(url, additional_headers=headers, origin=f"http://127.0.0.1:{port}") as ws:
            while json.loads(await ws.recv())["type"] != "history_end":
                pass
            connected.append(job_id)
            if len(connected) == len(watch):
                ready.set()
            while not stop.is_set():
                try:
                    frame = json.loads(await asyncio.wait_for(ws.recv(), 1.0))
                except TimeoutError:
                    continue
                now = time.time()
                if frame["type"] == "metrics":
                    received.extend(now - p[7] for p in frame["points"])

    async def viewers() -> None:
        connected: list[int] = []
        await asyncio.gather(*(viewer(job_id, connected) for job_id in watch))

    viewer_thread = threading.Thread(target=lambda: asyncio.run(viewers()), daemon=True)
    viewer_thread.start()
    if not ready.wait(30):
        raise SystemExit("the WebSocket viewers did not connect")
    fakes = [FakeTask(task.pk, outboxes[task.index].send, first_step) for _job, task in tasks]
    interval = 1.0 / args.rate
    start = time.monotonic()
    tick = 0
    while time.monotonic() - start < args.seconds:
        for fake in fakes:
            fake.emit({"loss": 1.0 / (fake.step + 1)})
        tick += 1
        time.sleep(max(0.0, start + tick * interval - time.monotonic()))
    deadline = time.monotonic() + 15
    while len(received) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    for fake in fakes:
        fake.close()
    received_ms = sorted(x * 1000 for x in received)
    q = statistics.quantiles(received_ms, n=100) if len(received_ms) > 1 else [float("nan")] * 99
    print(
        f"latency ({label}): {args.jobs} jobs x {args.tasks} tasks x {args.rate:g} events/s for {args.seconds:g} s: "
        f"points due to viewers {expected}, received {len(received_ms)}"
    )
    print(f"  TF-side timestamp -> WebSocket frame: p50 {q[49]:.1f} ms, p95 {q[94]:.1f} ms, p99 {q[98]:.1f} ms")


def ingest_rate(args, tasks, outboxes, MetricPoint) -> None:  # type: ignore[no-untyped-def]
    metrics_per_event = 10
    events_per_task = args.ingest_points // metrics_per_event // len(tasks[: args.tasks])
    fakes = [FakeTask(task.pk, outboxes[task.index].send) for _job, task in tasks[: args.tasks]]
    # Let the latency phase's backlog drain first, so this phase measures only its own points.
    settle = time.monotonic() + 120
    previous = -1
    while time.monotonic() < settle and (count := MetricPoint.objects.count()) != previous:
        previous = count
        time.sleep(2)
    before = MetricPoint.objects.count()
    sent = events_per_task * len(fakes) * metrics_per_event
    values = {f"m{i}": float(i) for i in range(metrics_per_event)}
    start = time.monotonic()
    for _ in range(events_per_task):
        for fake in fakes:
            fake.emit(values)
    for fake in fakes:
        fake.close()
    written = time.monotonic() - start
    deadline = time.monotonic() + 120
    stored = 0
    while time.monotonic() < deadline:
        stored = MetricPoint.objects.count() - before
        if stored >= sent:
            break
        time.sleep(0.2)
    elapsed = time.monotonic() - start
    print(
        f"ingest: {sent} points from {len(fakes)} tasks (written in {written:.1f} s): "
        f"stored {stored} in {elapsed:.1f} s -> {stored / elapsed:,.0f} points/s; lost {max(0, sent - stored)}, "
        f"duplicated {max(0, stored - sent)}"
    )


if __name__ == "__main__":
    sys.exit(main())
