"""The job WebSocket: who may subscribe, history then live without gap or duplicate, downsampled history, points
from a real running job reaching a subscribed client, and the job's state, tasks and log tail over the same socket."""

from __future__ import annotations

import time
from urllib.parse import urlencode

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from config.asgi import application
from contracts.protocol import TASK_LOGS, TASK_METRICS
from dashboard.routing import websocket_urlpatterns
from orchestrator.metrics import ingest
from orchestrator.models import Job, MetricPoint, Task
from tests import factories
from tests.support.wire import sealed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def make_job(owner):
    host, token = factories.host("node-0")
    # Running, not queued: the session's orchestrator schedules queued jobs on every watchdog tick, and this one's
    # host has no capacity, so a queued job could be failed as unplaceable under the test's feet.
    job = Job.objects.create(
        owner=owner, cluster=host.cluster, name="j", strategy="multi_worker_mirrored", program_kind="script", attempt=1,
        state="running",
    )  # fmt: skip
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=host, state="running")
    return host, token, job, task


def batch(host, token, task, steps):
    events = [
        {
            "kind": "metric",
            "ts": time.time(),
            "mono": 0.0,
            "step": s,
            "epoch": 1,
            "phase": "train",
            "metrics": {"loss": 1 / s},
        }
        for s in steps
    ]
    body = {"task_id": task.pk, "attempt": 1, "events": events}
    return sealed(host.name, token, TASK_METRICS, body)


async def connect(user, job_id, since=None, log_since=None):
    query = urlencode({k: v for k, v in (("since", since), ("log_since", log_since)) if v is not None})
    path = f"/ws/jobs/{job_id}/" + (f"?{query}" if query else "")
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    connected, code = await communicator.connect()
    return communicator, connected, code


STATE_FRAMES = ("job", "task", "log")  # sent on connect, before the metric history


async def read_history(communicator, state=None):
    """The metric history up to `history_end`; the state frames sent before it go to `state` when given."""
    points = []
    while True:
        frame = await communicator.receive_json_from(timeout=5)
        if frame["type"] == "history_end":
            return points, frame
        if frame["type"] in STATE_FRAMES:
            if state is not None:
                state.append(frame)
            continue
        assert frame["type"] == "metrics" and frame["history"] is True
        points.extend(frame["points"])


async def next_frame(communicator, kind, until=lambda frame: True):
    """The next frame of type `kind` for which `until` holds (others are skipped: job ids are reused between tests,
    so a late hint about an earlier test's job may bring a frame of the same truth first)."""
    while True:
        frame = await communicator.receive_json_from(timeout=10)
        if frame["type"] == kind and until(frame):
            return frame


async def test_anonymous_visitors_and_other_users_are_refused(alice, bob):
    _host, _token, job, _task = await sync_to_async(make_job)(alice)

    anonymous = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/", headers=[(b"origin", b"http://localhost")])
    connected, code = await anonymous.connect()
    assert not connected and code == 4403
    _other, connected, code = await connect(bob, job.pk)
    assert not connected and code == 4403
    cross_site = WebsocketCommunicator(
        application, f"/ws/jobs/{job.pk}/", headers=[(b"origin", b"http://evil.example")]
    )
    connected, _code = await cross_site.connect()
    assert not connected


async def test_history_then_live_then_reconnect_has_no_gap_and_no_duplicate(alice):
    host, token, job, task = await sync_to_async(make_job)(alice)
    store = sync_to_async(ingest.handle_task_metrics)
    await store(batch(host, token, task, range(1, 6)))

    socket, connected, _ = await connect(alice, job.pk)
    assert connected
    history, _end = await read_history(socket)
    assert [p[4] for p in history] == [1, 2, 3, 4, 5]

    await store(batch(host, token, task, range(1, 9)))  # 1-5 redelivered, 6-8 new
    live = await next_frame(socket, "metrics")  # a state frame may come first: ids are reused between tests
    assert live["history"] is False
    assert [p[4] for p in live["points"]] == [6, 7, 8]
    cursor = live["cursor"]
    await socket.disconnect()

    await store(batch(host, token, task, [9, 10]))  # while the page is away
    again, connected, _ = await connect(alice, job.pk, since=cursor)
    missed, _end = await read_history(again)
    assert [p[4] for p in missed] == [9, 10]
    await again.disconnect()

    seen = [p[0] for p in history + live["points"] + missed]
    assert len(seen) == len(set(seen)) == 10
    assert await sync_to_async(MetricPoint.objects.filter(job=job).count)() == 10


async def test_a_long_series_loads_downsampled(alice):
    _host, _token, job, task = await sync_to_async(make_job)(alice)

    def fill() -> None:
        MetricPoint.objects.bulk_create(
            MetricPoint(job=job, task=task, phase="train", name="loss", step=s, value=1 / s, ts=float(s))
            for s in range(1, 10_001)
        )

    await sync_to_async(fill)()

    socket, _connected, _ = await connect(alice, job.pk)
    history, end = await read_history(socket)
    await socket.disconnect()

    assert end["downsampled"] is True
    steps = [p[4] for p in history]
    assert len(steps) == 2000 and steps[0] == 1 and steps[-1] == 10_000
    assert end["cursor"] == await sync_to_async(lambda: MetricPoint.objects.latest("seq").seq)()


async def test_points_from_a_running_job_reach_a_subscribed_client(alice, orchestrator, start_agent):
    from tests.orchestrator.test_jobs_e2e import PROGRAMS

    def launch() -> int:
        host, token = factories.host("live-0", port_min=29000)
        host.cpu_slots = 2
        host.save()
        start_agent(host.name, token)
        client = APIClient()
        client.force_authenticate(alice)
        script = SimpleUploadedFile("mirrored_fit.py", (PROGRAMS / "mirrored_fit.py").read_bytes())
        data = {"name": "live", "strategy": "mirrored", "devices_per_worker": 2, "args": "--epochs 6", "script": script}
        return client.post("/api/jobs/", data, format="multipart").json()["id"]

    job_id = await sync_to_async(launch)()
    socket, connected, _ = await connect(alice, job_id)
    assert connected
    await read_history(socket)

    live_points = []
    deadline = time.monotonic() + 120
    while not live_points and time.monotonic() < deadline:
        frame = await socket.receive_json_from(timeout=120)
        if frame["type"] == "metrics":
            assert frame["history"] is False
            live_points = frame["points"]
    await socket.disconnect()

    assert live_points, "no live metric frame arrived"
    assert {"loss", "examples_per_s"} & {p[3] for p in live_points}


def log_batch(host, token, task, lines):
    body = {"task_id": task.pk, "attempt": 1, "lines": [[seq, "stdout", f"line {seq}"] for seq in lines]}
    return sealed(host.name, token, TASK_LOGS, body)


async def test_the_socket_carries_the_jobs_state_its_tasks_and_their_log_lines(alice):
    from orchestrator.metrics import ingest

    host, token, job, task = await sync_to_async(make_job)(alice)
    store_logs = sync_to_async(ingest.handle_task_logs)
    await store_logs(log_batch(host, token, task, range(3)))

    socket, connected, _ = await connect(alice, job.pk)
    assert connected
    state: list[dict] = []
    await read_history(socket, state)
    by_type = {frame["type"]: frame for frame in state}
    assert by_type["job"]["state"] == "running" and 'id="job-state"' in by_type["job"]["html"]
    assert by_type["task"]["tasks"] == [
        {"id": task.pk, "label": "worker 0", "host": "node-0", "state": "running", "exit_code": None, "restarts": 0}
    ]
    lines = [[s, "stdout", f"line {s}"] for s in range(3)]
    assert by_type["log"] == {"type": "log", "task": task.pk, "lines": lines, "cursor": 2}

    # A task's state changes: the page hears of it at once, the whole state, rendered.
    def succeed() -> None:
        task.state, task.exit_code = "succeeded", 0
        task.save()

    await sync_to_async(succeed)()
    tasks = await next_frame(socket, "task", lambda frame: frame["tasks"][0]["state"] != "running")
    assert tasks["tasks"][0]["state"] == "succeeded" and tasks["tasks"][0]["exit_code"] == 0
    # New lines, and a batch delivered again: only what the page has not had.
    await store_logs(log_batch(host, token, task, range(5)))
    assert (await next_frame(socket, "log"))["lines"] == [[3, "stdout", "line 3"], [4, "stdout", "line 4"]]
    await socket.disconnect()

    # Lines of one task committed out of order (5 after 6): the earlier one still reaches the page.
    socket, _connected, _ = await connect(alice, job.pk)
    await read_history(socket)
    await store_logs(log_batch(host, token, task, [6]))
    first = await next_frame(socket, "log")
    await store_logs(log_batch(host, token, task, [5]))
    second = await next_frame(socket, "log")
    assert [line[0] for line in first["lines"]] == [6]
    assert [line[0] for line in second["lines"]] == [5, 6]  # the page keeps each seq once
    await socket.disconnect()


async def test_a_reconnect_with_its_log_cursors_gets_exactly_the_lines_it_missed(alice):
    from orchestrator.metrics import ingest

    host, token, job, task = await sync_to_async(make_job)(alice)
    store_logs = sync_to_async(ingest.handle_task_logs)
    await store_logs(log_batch(host, token, task, range(3)))

    socket, _connected, _ = await connect(alice, job.pk)
    state: list[dict] = []
    await read_history(socket, state)
    [first] = [frame for frame in state if frame["type"] == "log"]
    assert [line[0] for line in first["lines"]] == [0, 1, 2] and first["cursor"] == 2
    await socket.disconnect()

    await store_logs(log_batch(host, token, task, range(6)))  # 3-5 while the page is away, 0-2 delivered again
    again, _connected, _ = await connect(alice, job.pk, log_since=f"{task.pk}:{first['cursor']}")
    state = []
    await read_history(again, state)
    [missed] = [frame for frame in state if frame["type"] == "log"]
    assert missed == {
        "type": "log",
        "task": task.pk,
        "lines": [[s, "stdout", f"line {s}"] for s in (3, 4, 5)],
        "cursor": 5,
    }
    await again.disconnect()

    # A page that has it all gets no log frame; a cursor that does not parse counts as none (the whole tail).
    current, _connected, _ = await connect(alice, job.pk, log_since=f"{task.pk}:5")
    state = []
    await read_history(current, state)
    assert [frame["type"] for frame in state] == ["job", "task"]
    await current.disconnect()
    garbled, _connected, _ = await connect(alice, job.pk, log_since=f"{task.pk}:x,,oops")
    state = []
    await read_history(garbled, state)
    assert [line[0] for frame in state if frame["type"] == "log" for line in frame["lines"]] == list(range(6))
    await garbled.disconnect()


async def test_a_burst_longer_than_the_tail_sends_its_last_lines_and_the_next_line_alone(alice):
    from dashboard.page_data import LOG_TAIL_LINES
    from orchestrator.metrics import ingest

    host, token, job, task = await sync_to_async(make_job)(alice)
    store_logs = sync_to_async(ingest.handle_task_logs)
    socket, _connected, _ = await connect(alice, job.pk)
    await read_history(socket)

    await store_logs(log_batch(host, token, task, range(200)))
    burst = await next_frame(socket, "log")
    assert [line[0] for line in burst["lines"]] == list(range(200 - LOG_TAIL_LINES, 200)) and burst["cursor"] == 199
    await store_logs(log_batch(host, token, task, [200]))
    assert (await next_frame(socket, "log"))["lines"] == [[200, "stdout", "line 200"]]
    await socket.disconnect()


async def test_a_cancel_reaches_the_page_as_the_jobs_and_its_tasks_new_state(alice):
    from orchestrator.jobs import lifecycle

    _host, _token, job, _task = await sync_to_async(make_job)(alice)
    socket, _connected, _ = await connect(alice, job.pk)
    await read_history(socket)

    assert await sync_to_async(lifecycle.cancel)(job.pk, by="alice")
    frame = await next_frame(socket, "job", lambda frame: frame["state"] != "running")
    assert frame["state"] == "cancelled" and frame["terminal"] is True and "cancelled by alice" in frame["html"]
    tasks = await next_frame(socket, "task")
    assert [t["state"] for t in tasks["tasks"]] == ["stopping"]
    await socket.disconnect()
