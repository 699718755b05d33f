"""Metric points per job: past TFDASH_MAX_POINTS_PER_JOB the series are thinned (every epoch_end point, train points
on every TFDASH_POINTS_THIN_STRIDE-th step), past twice it nothing more, through the real stream and under
redelivery; the job page says so; a reconnecting socket's backlog is bounded."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from contracts.protocol import TASK_METRICS
from dashboard.routing import websocket_urlpatterns
from orchestrator.metrics import history
from orchestrator.models import Job, MetricPoint, Task
from tests.orchestrator.metrics.conftest import consumer, envelope

pytestmark = pytest.mark.django_db(transaction=True)

LIMITS = {"TFDASH_MAX_POINTS_PER_JOB": 10, "TFDASH_POINTS_THIN_STRIDE": 5}


def point(step: int, phase: str = "train") -> dict[str, Any]:
    return {"kind": "metric", "ts": time.time(), "mono": 1.0, "step": step, "epoch": step // 10, "phase": phase,
            "metrics": {"loss": 1.0 / step}}  # fmt: skip


def entry(host: Any, token: str, task: Task, events: list[dict[str, Any]]) -> dict[str, str]:
    body = {"task_id": task.pk, "attempt": 1, "events": events}
    return {"name": TASK_METRICS, "envelope": json.dumps(envelope(host, token, body))}


def steps(job: Job) -> list[tuple[str, int]]:
    return list(MetricPoint.objects.filter(job=job).order_by("step", "phase").values_list("phase", "step"))


@override_settings(**LIMITS)
def test_past_the_limit_the_series_are_thinned_then_stopped(stream, running, client):
    client_redis, name = stream
    owner, host, token, job, task = running
    reader = consumer(client_redis, name)
    first = entry(host, token, task, [point(s) for s in range(1, 11)])
    client_redis.xadd(name, first)
    reader.drain_once()
    before = list(MetricPoint.objects.filter(job=job).order_by("id").values_list("id", "step", "value"))
    client_redis.xadd(name, entry(host, token, task, [point(s) for s in range(11, 31)] + [point(23, "epoch_end")]))
    client_redis.xadd(name, first)  # an agent's resend of what is stored: counted once
    client_redis.xadd(name, entry(host, token, task, [point(s) for s in range(31, 101)]))
    while reader.drain_once():
        pass

    assert list(MetricPoint.objects.filter(job=job, step__lte=10).order_by("id").values_list("id", "step", "value")) \
        == before  # fmt: skip
    assert steps(job) == [
        *(("train", s) for s in range(1, 11)),  # whole up to the limit
        ("train", 15), ("train", 20), ("epoch_end", 23), ("train", 25), ("train", 30),  # thinned
        ("train", 35), ("train", 40), ("train", 45), ("train", 50), ("train", 55),  # ...up to twice the limit
    ]  # fmt: skip
    job.refresh_from_db()
    assert (job.points_stored, job.points_thinned) == (20, (21 - 5) + (70 - 5))  # the resend counts in neither
    client.force_login(owner)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert (
        "The metric series were thinned: past 10 points per job only every 5th step (and every epoch end) is "
        "stored, past 20 none (limit TFDASH_MAX_POINTS_PER_JOB); 81 points were not stored, 20 are."
    ) in page


async def history_of(communicator: WebsocketCommunicator) -> tuple[list[list[Any]], dict[str, Any]]:
    points: list[list[Any]] = []
    while True:
        frame = await communicator.receive_json_from(timeout=5)
        if frame["type"] == "history_end":
            return points, frame
        if frame["type"] == "metrics":
            points.extend(frame["points"])


@pytest.fixture
def thirty_points(running: Any) -> tuple[Any, Job, list[int]]:
    owner, _host, _token, job, task = running
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, task=task, phase="train", name="loss", step=s, value=1.0 / s, ts=float(s))
        for s in range(1, 31)
    )
    return owner, job, list(MetricPoint.objects.filter(job=job).order_by("seq").values_list("seq", flat=True))


@override_settings(TFDASH_SOCKET_BACKLOG_POINTS=10)
async def test_a_long_reconnect_backlog_is_sent_thinned(thirty_points, monkeypatch):
    owner, job, ids = thirty_points
    monkeypatch.setattr(history, "SERIES_POINTS", 8)

    # A short backlog comes whole...
    short = await connect(owner, job.pk, since=ids[-10])
    points, end = await history_of(short)
    assert [p[0] for p in points] == ids[-9:] and end["cursor"] == ids[-1] and not end["downsampled"]
    await short.disconnect()
    # ...a long one thinned, from the page's cursor on, with the same cursor at its end.
    long = await connect(owner, job.pk, since=ids[4])
    points, end = await history_of(long)
    await long.disconnect()

    assert 0 < len(points) <= 8
    assert all(p[0] > ids[4] for p in points) and [p[0] for p in points] == sorted(p[0] for p in points)
    assert end["cursor"] == ids[-1] and end["downsampled"] is True


async def connect(user: Any, job_id: int, since: int) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/jobs/{job_id}/?since={since}")
    communicator.scope["user"] = user
    connected, _code = await communicator.connect()
    assert connected
    return communicator
