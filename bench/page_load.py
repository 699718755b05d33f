"""Job page load with a long history: a finished job with 100,000 (or, with --points, 10 million) stored points per
train series, opened in headless Chromium; how long until its loss chart is drawn.

The figure is `tfdashLive.firstDrawMs`, which the job page (dashboard/static/dashboard/live/) sets when uPlot
finishes the page's first chart draw: milliseconds from navigation start (performance.timeOrigin). It covers the
HTML, the scripts, the WebSocket, the history query and its downsampling in PostgreSQL (2,000 points per series;
from the job's rollups, orchestrator/metrics/rollups.py, which the bench builds the way the periodic task does, and
times), and the first draw. Besides the train series each task has an epoch_end loss per 1,000 steps (short series
are read whole). Real parts:
PostgreSQL, Redis (Channels), Daphne, Chromium. Uses its own database (tfdash_pageload) and Redis database 5.

Where the time goes, per load and as medians (ms): `html` (navigation start to the HTML's last byte), `scripts` (from
there to the page's modules running: fetched, parsed, run; the tfdash:scripts-run mark), `sock open` (new WebSocket
to open: the handshake, the session and the consumer's rights checks), `server` (open to `history_end` received: the
state, log tail and history frames), `hist query` (the consumer's own time for the history read, in the `timing` of
its `history_end` frame; it runs beside the state and log reads), `draw` (`history_end` to the first chart drawn) and
`first draw`, the figure. Then the server's own times: the checks, the state, log and history reads, the send.

    .venv/bin/python bench/page_load.py [--points 100000] [--tasks 2] [--loads 5]
    .venv/bin/python bench/page_load.py --points 10000000 --tasks 1     # 20 M train points: about 4 minutes

Target: under 400 ms at the median, at 100 k and at 10 M points per series.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB = "tfdash_pageload"

from stack import free_port, local_env, prepare_database  # noqa: E402

# Static files collected here, served by WhiteNoise as in production.
local_env(DB, 5, TFDASH_VAR_DIR="/tmp/tfdash-pageload")
CHROMIUM = os.environ.get("TFDASH_CHROMIUM", "/usr/bin/chromium")
SERIES = ("loss", "examples_per_s")


def make_job(points: int, tasks: int) -> int:
    """A succeeded MultiWorkerMirrored job: `points` train points per (task, metric), an epoch_end loss per 1,000
    steps."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from orchestrator.identity import tokens
    from orchestrator.models import Cluster, Host, Job, MetricPoint, Task

    user = get_user_model().objects.create_user("bench", password="bench-pass-1")
    cluster = Cluster.objects.create(name="bench")
    host = Host(cluster=cluster, name="bench-0", address="127.0.0.1", port_min=30000, port_max=30099)
    tokens.issue(host)
    job = Job.objects.create(
        owner=user,
        cluster=cluster,
        name="long history",
        strategy="multi_worker_mirrored",
        program_kind="script",
        workers=tasks,
        attempt=1,
        state="succeeded",
    )
    task_ids = [
        Task.objects.create(job=job, attempt=1, type="worker", index=i, host=host, state="succeeded").pk
        for i in range(tasks)
    ]
    # Written by PostgreSQL itself (generate_series): 20 M rows through the client took minutes. Numbered by step,
    # then task, then series, as the ingest would number a run where every task reports each step together.
    table = MetricPoint._meta.db_table
    series = len(SERIES) * tasks
    with connection.cursor() as cursor:
        for i, task in enumerate(task_ids):
            cursor.execute(
                f"""INSERT INTO {table} (job_id, task_id, phase, name, step, epoch, value, ts, seq)
                    SELECT %s, %s, 'train', 'loss', s, 1 + s / 1000, (1 + 0.2 * %s) / sqrt(s), 1.7e9 + s * 0.01,
                           (s - 1) * %s + %s
                    FROM generate_series(1, %s) AS s""",  # noqa: S608 - the model's table; values are parameters
                [job.pk, task, i, series, 2 * i + 1, points],
            )
            cursor.execute(
                f"""INSERT INTO {table} (job_id, task_id, phase, name, step, epoch, value, ts, seq)
                    SELECT %s, %s, 'train', 'examples_per_s', s, 1 + s / 1000, 1000.0 - 50 * %s + s %% 97,
                           1.7e9 + s * 0.01, (s - 1) * %s + %s
                    FROM generate_series(1, %s) AS s""",  # noqa: S608
                [job.pk, task, i, series, 2 * i + 2, points],
            )
            cursor.execute(
                f"""INSERT INTO {table} (job_id, task_id, phase, name, step, epoch, value, ts, seq)
                    SELECT %s, %s, 'epoch_end', 'loss', s, s / 1000, (1 + 0.2 * %s) / sqrt(s), 1.7e9 + s * 0.01,
                           %s + s / 1000
                    FROM generate_series(1000, %s, 1000) AS s""",  # noqa: S608
                [job.pk, task, i, points * series + i * (points // 1000), points],
            )
        cursor.execute(f"SELECT max(seq) FROM {table} WHERE job_id = %s", [job.pk])  # noqa: S608
        Job.objects.filter(pk=job.pk).update(points_seq=cursor.fetchone()[0])
        cursor.execute(f"ANALYZE {table}")
    return job.pk


def roll_up(job_id: int) -> int:
    """The job's rollups, batch after batch, as the periodic task builds them while a job runs."""
    from django.db import connection

    from orchestrator.metrics import rollups
    from orchestrator.models import PointRollup

    done = 0
    while moved := rollups.roll_up(job_id):
        done += moved
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {PointRollup._meta.db_table}")
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=100_000, help="stored points per series")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--loads", type=int, default=5, help="page loads to time (after one warm-up)")
    args = parser.parse_args()

    prepare_database(collectstatic=True)
    import django

    django.setup()
    t0 = time.perf_counter()
    job_id = make_job(args.points, args.tasks)
    stored = args.points * args.tasks * len(SERIES)
    print(f"stored {stored:,} train points ({args.points:,} per series, {args.tasks * len(SERIES)} series) and "
          f"{args.tasks * (args.points // 1000):,} epoch ends in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    t0 = time.perf_counter()
    rolled = roll_up(job_id)
    print(f"rolled up {rolled:,} points in {time.perf_counter() - t0:.1f} s (what the periodic task does meanwhile)")

    port = free_port()
    log = open("/tmp/bench-pageload-web.log", "wb")  # noqa: SIM115 - the server writes to it until the bench ends
    web = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            if time.monotonic() > deadline or web.poll() is not None:
                raise SystemExit("daphne did not start: see /tmp/bench-pageload-web.log")
            time.sleep(0.05)
        return measure(f"http://127.0.0.1:{port}", job_id, args.loads, args.points)
    finally:
        web.terminate()
        web.wait(10)


# Where a load's time goes, read in the page after its first draw: the navigation and resource entries of the
# Performance timeline and the marks the job page sets (dashboard/static/dashboard/live/), all in ms from navigation
# start, and the server's own times for the socket's first reads (its `history_end` frame, tfdashLive.serverTiming).
_TIMELINE = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const mark = (name) => {
    const found = performance.getEntriesByName("tfdash:" + name, "mark");
    return found.length ? found[found.length - 1].startTime : null;
  };
  const scripts = performance.getEntriesByType("resource").filter((r) => r.initiatorType === "script"
    || r.name.endsWith(".js"));
  return {
    html: nav.responseEnd,
    htmlStart: nav.responseStart,
    parsed: nav.domInteractive,
    scriptFiles: scripts.length,
    scriptsFetched: scripts.length ? Math.max(...scripts.map((r) => r.responseEnd)) : null,
    scriptBytes: scripts.reduce((n, r) => n + (r.transferSize || 0), 0),
    scriptsRun: mark("scripts-run"),
    socketConnect: mark("socket-connect"),
    socketOpen: mark("socket-open"),
    firstFrame: mark("first-frame"),
    historyEnd: mark("history-end"),
    drawStart: mark("draw-start"),
    firstDraw: mark("first-draw"),
    server: tfdashLive.serverTiming || {},
  };
}"""

# The columns printed per load and as medians: (heading, how it is computed from the timeline, in ms).
PHASES = (
    ("html", lambda t: t["html"]),  # navigation start -> the HTML's last byte
    ("scripts", lambda t: t["scriptsRun"] - t["html"]),  # -> the page's modules fetched, parsed and running
    ("sock open", lambda t: t["socketOpen"] - t["socketConnect"]),  # new WebSocket -> open
    ("server", lambda t: t["historyEnd"] - t["socketOpen"]),  # open -> history_end received
    ("hist query", lambda t: t["server"].get("history_query_ms")),  # of which: the history read (the server's time)
    ("draw", lambda t: t["firstDraw"] - t["historyEnd"]),  # history_end -> first chart drawn
    ("first draw", lambda t: t["firstDraw"]),  # navigation start -> first chart drawn: the figure
)


def _phases(timeline: dict) -> list[float | None]:
    values = []
    for _heading, how in PHASES:
        try:
            value = how(timeline)
        except (TypeError, KeyError):
            value = None  # a mark the page did not set (the load went another way): shown as "-"
        values.append(value)
    return values


def _row(label: str, values: list[float | None]) -> str:
    return f"  {label:<18}" + "".join(f"{'-' if v is None else f'{v:.0f}':>11}" for v in values)


def measure(base: str, job_id: int, loads: int, points: int) -> int:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/accounts/login/?next=/jobs/")
        page.fill("#id_username", "bench")
        page.fill("#id_password", "bench-pass-1")
        page.click("form.login button[type=submit]")
        page.wait_for_url(f"{base}/jobs/")
        results = []
        rows = []
        servers = []
        for attempt in range(loads + 1):  # the first load warms the server's caches and Chromium's
            page.goto(f"{base}/jobs/{job_id}/")
            page.wait_for_function(
                "() => window.tfdashLive && tfdashLive.firstDrawMs !== null && tfdashLive.status === 'live'",
                timeout=60_000,
                polling=20,
            )
            first_draw, drawn, held = page.evaluate(
                "[tfdashLive.firstDrawMs, tfdashLive.chartPoints('loss'), tfdashLive.seriesPointCount('loss')]"
            )
            timeline = page.evaluate(_TIMELINE)
            if attempt:
                results.append(first_draw)
                rows.append(_phases(timeline))
                servers.append(timeline["server"])
            served = timeline["server"].get("points", "?")
            print(f"  load {attempt}{' (warm-up)' if not attempt else ''}: first chart drawn at {first_draw:.0f} ms "
                  f"({drawn} x values drawn, {held} loss points held of {points:,} stored per task; "
                  f"{served} history points sent; {timeline['scriptFiles']} script files)")  # fmt: skip
        browser.close()
    print("where the time goes (ms; html, first draw: from navigation start; the rest: each phase's own length)")
    print(f"  {'load':<18}" + "".join(f"{heading:>11}" for heading, _how in PHASES))
    for number, row in enumerate(rows, 1):
        print(_row(str(number), row))
    medians = [statistics.median(column) if None not in column else None for column in zip(*rows, strict=True)]
    print(_row("median", medians))
    server = [timing for timing in servers if timing]
    if server:
        parts = ", ".join(f"{key[:-3].replace('_', ' ')} {statistics.median(t.get(key, 0) for t in server):.0f}"
                          for key in server[0] if key.endswith("_ms"))  # fmt: skip
        print(f"  the socket's first reads on the server (median ms): {parts}")
    median = statistics.median(results)
    print(f"navigation start -> first chart drawn: median {median:.0f} ms, min {min(results):.0f}, "
          f"max {max(results):.0f} over {len(results)} loads (target < 400 ms)")  # fmt: skip
    return 0 if median < 400 else 1


if __name__ == "__main__":
    raise SystemExit(main())
