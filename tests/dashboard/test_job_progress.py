"""A job's progress on its pages (issue 45): the jobs list says "epoch 3/10 · ETA 2 min", the job page the whole line
(step, examples/s), both from Job.progress, the ETA only while the job runs; the page's socket carries a `progress`
frame with the words as soon as the ingest stored points that moved it."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import sync_to_async

from contracts.protocol import TASK_METRICS
from orchestrator.metrics import ingest
from orchestrator.models import Job, Task
from tests import factories
from tests.dashboard.test_job_socket import connect, next_frame, read_history
from tests.support.wire import sealed

PROGRESS = {"epoch": 3, "epochs": 10, "step": 90, "steps": 300, "examples_per_s": 1234.5, "eta_s": 150.0,
            "resumed_from_epoch": 0}  # fmt: skip


def a_job(owner, **fields) -> Job:
    defaults = {"name": "mnist", "strategy": "multi_worker_mirrored", "program_kind": "script", "workers": 2}
    return Job.objects.create(owner=owner, cluster=factories.cluster(), **{**defaults, **fields})


@pytest.mark.django_db
def test_the_jobs_list_and_the_job_page_show_the_progress_and_the_eta_while_it_runs(client, alice):
    running = a_job(alice, state="running", progress={**PROGRESS, "at": time.time() - 30})
    ended = a_job(alice, name="done", state="failed", progress={**PROGRESS, "at": time.time() - 30})
    fresh = a_job(alice, name="fresh", state="running")
    client.force_login(alice)

    listed = client.get("/jobs/").content.decode()
    assert '<td class="progress">epoch 3/10 · ETA 2 min</td>' in listed  # 150 s as of 30 s ago
    assert '<td class="progress">epoch 3/10</td>' in listed  # the failed one: no ETA
    page = client.get(f"/jobs/{running.pk}/").content.decode()
    assert (
        '<p class="job-progress" id="job-progress">epoch 3/10 · step 90/300 · 1,234 examples/s · ETA 2 min</p>' in page
    )
    assert '<p class="job-progress" id="job-progress">epoch 3/10 · step 90/300 · 1,234 examples/s</p>' in (
        client.get(f"/jobs/{ended.pk}/live/").content.decode()
    )
    assert '<p class="job-progress" id="job-progress" hidden></p>' in client.get(f"/jobs/{fresh.pk}/").content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_socket_carries_the_progress_the_ingest_made(alice):
    def setup():
        host, token = factories.host("node-0")
        job = Job.objects.create(
            owner=alice, cluster=host.cluster, name="j", strategy="multi_worker_mirrored", program_kind="script",
            attempt=1, state="running",
        )  # fmt: skip
        task = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=host, state="running")
        return host, token, job, task

    host, token, job, task = await sync_to_async(setup)()
    socket, connected, _ = await connect(alice, job.pk)
    assert connected
    await read_history(socket)
    now = time.time()
    events = [
        {"kind": "facts", "ts": now, "facts": {"epochs": 4, "steps_per_epoch": 10, "resumed_from_epoch": 0}},
        {"kind": "metric", "ts": now, "step": 10, "epoch": 1, "phase": "epoch_end", "metrics": {"epoch_time_s": 60.0}},
    ]
    body = {"task_id": task.pk, "attempt": 1, "events": events}
    await sync_to_async(ingest.handle_task_metrics)(sealed(host.name, token, TASK_METRICS, body))

    frame = await next_frame(socket, "progress")
    assert frame["progress"]["epoch"] == 1 and frame["progress"]["eta_s"] == 180.0
    assert frame["text"] == "epoch 1/4 · step 10/40 · ETA 3 min"
    await socket.disconnect()
