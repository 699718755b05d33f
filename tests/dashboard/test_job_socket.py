"""The job WebSocket: who may subscribe, history then live without gap or duplicate, downsampled history, and
points from a real running job reaching a subscribed client."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from config.asgi import application
from dashboard.routing import websocket_urlpatterns
from orchestrator.metrics import ingest
from orchestrator.models import Job, MetricPoint, Task
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def make_job(owner):
    host, token = factories.host("node-0")
    job = Job.objects.create(
        owner=owner, cluster=host.cluster, name="j", strategy="multi_worker_mirrored", program_kind="script", attempt=1
    )
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
    return {"host": host.name, "token": token, "body": body, "sent_at": time.time(), "protocol": 1}


async def connect(user, job_id, since=None):
    path = f"/ws/jobs/{job_id}/" + (f"?since={since}" if since is not None else "")
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    connected, code = await communicator.connect()
    return communicator, connected, code


async def read_history(communicator):
    points = []
    while True:
        frame = await communicator.receive_json_from(timeout=5)
        if frame["type"] == "history_end":
            return points, frame
        assert frame["type"] == "metrics" and frame["history"] is True
        points.extend(frame["points"])


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
    live = await socket.receive_json_from(timeout=5)
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
    assert end["cursor"] == await sync_to_async(lambda: MetricPoint.objects.latest("id").pk)()


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
