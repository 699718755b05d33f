"""One task cannot flood Redis or the ingest (issue 42), end to end: real agent, real Redis (the suite's, started as
make run starts it), real ingest. A task writes 1,000 artifact lines naming a 64 MiB file (each an ~85 MiB stream
entry were it sent) and then 32 MiB of output as fast as it prints, while a second job on the same host reports 100
points and prints 100 lines. Redis's memory and the ingest's resident memory stay under the bounds below, the
neighbour's points and lines all arrive, and the flooding job's page and API say what was dropped.

Bounds (contracts/publish_limits.py): the flooding task may send ARTIFACT_BURST_BYTES of artifacts at once (two of
64 MiB, ~170 MiB as entries) then 1 MiB/s, and 8 MiB of output then 1 MiB/s; a read hands the ingest about
READ_BYTES_BUDGET, so one 85 MiB entry at a time. Without the agent's bounds Redis fills to its maxmemory (1 GiB)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest
import redis

from orchestrator.models import Job, MetricPoint, Task
from tests.orchestrator.test_jobs_e2e import cluster_of, submit  # noqa: F401 - cluster_of is a fixture
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 2**20
# Two artifact entries of ~85 MiB in Redis at most, each read into the script's memory and a client's reply once.
REDIS_BOUND = 640 * MIB
# The ingest process: Django, plus one 64 MiB artifact decoded, checked and written at a time.
INGEST_BOUND = 1536 * MIB


class Watch:
    """Samples Redis's used_memory every 10 ms while a test runs; `over` once it passed REDIS_BOUND (the test then
    stops at once: without the bounds the flood would fill Redis to its maxmemory)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.most = 0
        self.over = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            used = int(self.client.info("memory")["used_memory"])
            self.most = max(self.most, used)
            if used > REDIS_BOUND:
                self.over.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def ingest_process() -> psutil.Process:
    """The session's ingest (tests/conftest.py starts it as a child of this process)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "ingest_metrics" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:  # a child that ended meanwhile (a task, an agent's helper)
            continue
    assert len(found) == 1, found
    return found[0]


def peak_rss(process: psutil.Process) -> int:
    """The process's peak resident memory since it was last reset (VmHWM)."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.timeout(300)
def test_a_task_flooding_artifacts_and_output_cannot_fill_redis_or_the_ingest_nor_starve_its_neighbour(
    api,
    client,
    cluster_of,  # noqa: F811
    redis_url,
):
    cluster_of(1, first_port=27600)  # both jobs on one host: one agent, one outbox, one stream
    redis_client = redis.Redis.from_url(redis_url)
    ingest = ingest_process()
    Path(f"/proc/{ingest.pid}/clear_refs").write_text("5")  # VmHWM from now on
    peak_before = int(redis_client.info("memory")["used_memory_peak"])
    watch = Watch(redis_client)
    started = time.monotonic()
    try:
        flood = submit(api, "artifact_flood.py", strategy="mirrored", workers=1, devices_per_worker=1)
        # The neighbour once the flood has begun: it then runs beside it (about 5 s, while the flood's artifacts and
        # output pass through the same agent and stream).
        wait_until(lambda: Task.objects.filter(job_id=flood, started_at__isnull=False).exists(), 60, interval=0.05,
                   what="the flooding task to start")  # fmt: skip
        neighbour = submit(api, "steady_neighbour.py", strategy="mirrored", workers=1, devices_per_worker=1)

        def ended(job_id: int) -> bool:
            assert not watch.over.is_set(), f"Redis used {watch.most:,} bytes, over {REDIS_BOUND:,}"
            return Job.objects.get(pk=job_id).state in ("succeeded", "failed", "cancelled")

        wait_until(lambda: ended(flood) and ended(neighbour), timeout=150, interval=0.2, what="both jobs to end")
        flood_task = Task.objects.get(job_id=flood)
        wait_until(lambda: flood_task.log_lines.filter(text__startswith="… lines dropped:").exists(), 30,
                   what="the flood's 'lines dropped' line")  # fmt: skip
    finally:
        watch.stop()
    took = time.monotonic() - started
    ingest_peak = peak_rss(ingest)
    print(
        f"flood test: {took:.1f} s; Redis used_memory at most {watch.most / MIB:.0f} MiB (sampled every 10 ms; "
        f"peak since start {int(redis_client.info('memory')['used_memory_peak']) / MIB:.0f} MiB); ingest peak RSS "
        f"{ingest_peak / MIB:.0f} MiB"
    )

    assert watch.most <= REDIS_BOUND
    if peak_before <= REDIS_BOUND:  # Redis's own peak, unless an earlier test of the session passed the bound
        assert int(redis_client.info("memory")["used_memory_peak"]) <= REDIS_BOUND
    assert ingest_peak <= INGEST_BOUND, f"ingest peak RSS {ingest_peak:,}"

    # The neighbour lost nothing: every point and every line, in order.
    assert Job.objects.get(pk=neighbour).state == "succeeded", Job.objects.get(pk=neighbour).reason
    steps = list(
        MetricPoint.objects.filter(job_id=neighbour, name="loss").order_by("step").values_list("step", flat=True)
    )
    assert steps == list(range(1, 101))
    lines = list(Task.objects.get(job_id=neighbour).log_lines.order_by("seq").values_list("text", flat=True))
    assert lines == [f"neighbour line {step}" for step in range(1, 101)]

    # The flooding job: its first artifacts were stored (the same name replaces), the rest dropped unread, and its
    # page, API and log say so.
    assert Job.objects.get(pk=flood).state == "succeeded", Job.objects.get(pk=flood).reason
    flood_task.refresh_from_db()
    assert 900 <= flood_task.artifacts_dropped < 1000
    assert flood_task.artifact_bytes_dropped == flood_task.artifacts_dropped * 64 * MIB
    assert flood_task.log_lines_dropped > 0
    assert list(Job.objects.get(pk=flood).artifacts.values_list("name", "size")) == [("flood.bin", 64 * MIB)]
    note = api.get(f"/api/jobs/{flood}/").json()["output_dropped"]
    assert f"{flood_task.artifacts_dropped:,} artifacts" in note and "log lines" in note
    task_row = api.get(f"/api/jobs/{flood}/tasks/").json()
    rows = task_row["results"] if isinstance(task_row, dict) else task_row
    assert rows[0]["output_dropped"]["artifacts"] == flood_task.artifacts_dropped
    client.force_login(Job.objects.get(pk=flood).owner)  # the page, as its owner sees it
    page = client.get(f"/jobs/{flood}/").content.decode()
    assert 'id="output-dropped"' in page and f"{flood_task.artifacts_dropped:,} artifacts" in page
    assert not Job.objects.filter(pk=neighbour).get().tasks.filter(artifacts_dropped__gt=0).exists()
