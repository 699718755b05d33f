"""Log bytes per task attempt: past TFDASH_MAX_LOG_BYTES_PER_TASK lines are dropped after ONE marker line, stored
through the real stream however often its entries are read; both log views stream the log page by page."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import override_settings

from contracts.protocol import METRICS_GROUP, TASK_LOGS
from orchestrator.metrics import ingest, log_reader
from orchestrator.models import Task, TaskLogLine
from tests.orchestrator.metrics.conftest import consumer, envelope
from tests.support.streaming import streamed

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = "… log truncated after 100 bytes; the rest was dropped (limit TFDASH_MAX_LOG_BYTES_PER_TASK)"
LINE = "x" * 19  # 20 bytes with its newline: five fill the 100-byte limit


def lines_entry(host: Any, token: str, task: Task, seqs: range) -> dict[str, str]:
    body = {"task_id": task.pk, "attempt": 1, "lines": [[seq, "stdout", f"{LINE[:-3]}{seq:03d}"] for seq in seqs]}
    return {"name": TASK_LOGS, "envelope": json.dumps(envelope(host, token, body))}


def stored(task: Task) -> list[tuple[int, str]]:
    return list(TaskLogLine.objects.filter(task=task).order_by("seq").values_list("seq", "text"))


@override_settings(TFDASH_MAX_LOG_BYTES_PER_TASK=100)
def test_past_the_limit_one_marker_is_stored_however_often_entries_are_read(stream, running, client):
    redis_client, name = stream
    owner, host, token, _job, task = running
    reader = consumer(redis_client, name)
    redis_client.xadd(name, lines_entry(host, token, task, range(0, 3)))
    assert reader.drain_once() == 1
    first = stored(task)
    # An agent resends (its outbox retries) and goes on: lines 2..8 overlap what is stored, then pass the limit.
    redis_client.xadd(name, lines_entry(host, token, task, range(2, 9)))
    # Read, stored, then the consumer dies before acknowledging: the entry stays pending...
    taken = redis_client.xreadgroup(METRICS_GROUP, "ingest", {name: ">"}, count=10)
    ingest.store_reports([(TASK_LOGS, json.loads(fields[b"envelope"])) for _id, fields in taken[0][1]])
    # ...and the restarted consumer reads it again.
    assert reader.drain_once(backlog=True) == 1
    redis_client.xadd(name, lines_entry(host, token, task, range(9, 12)))  # more output after the cut
    reader.drain_once()

    lines = stored(task)
    assert lines[: len(first)] == first  # nothing stored before is lost
    assert [seq for seq, _text in lines] == [0, 1, 2, 3, 4, 5]
    assert [text for _seq, text in lines if text == MARKER] == [MARKER]  # one marker, where the output was cut
    assert lines[-1] == (5, MARKER)
    task.refresh_from_db()
    assert (task.log_bytes, task.log_truncated) == (100, True)
    assert reader.dead == 0
    client.force_login(owner)  # the task table says so; the log itself ends with the marker
    assert (
        'title="past TFDASH_MAX_LOG_BYTES_PER_TASK">truncated' in client.get(f"/jobs/{task.job_id}/").content.decode()
    )
    assert streamed(client.get(f"/jobs/{task.job_id}/tasks/{task.pk}/log/")).decode().count(MARKER) == 1


@override_settings(TFDASH_MAX_LOG_BYTES_PER_TASK=100)
def test_each_attempt_has_its_own_limit(running):
    _owner, host, token, job, task = running
    task.state = "failed"
    task.save(update_fields=["state"])
    job.attempt = 2
    job.save(update_fields=["attempt"])
    again = Task.objects.create(job=job, attempt=2, type="worker", index=0, host=host, state="running")
    for run in (task, again):
        body = {"task_id": run.pk, "attempt": run.attempt, "lines": [[s, "stdout", LINE] for s in range(8)]}
        ingest.handle_task_logs(envelope(host, token, body))

    assert [len(stored(run)) for run in (task, again)] == [6, 6]  # five lines and the marker each


@pytest.fixture
def long_log(running: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Task]:
    """A task with 7 lines (one with markup) and pages of 3, so reading it takes several pages."""
    owner, _host, _token, _job, task = running
    monkeypatch.setattr(log_reader, "PAGE_LINES", 3)
    TaskLogLine.objects.bulk_create(
        TaskLogLine(task=task, seq=seq, stream="stderr" if seq == 6 else "stdout", text=f"line {seq} <b>")
        for seq in range(7)
    )
    return owner, task


def test_the_task_log_page_streams_every_line_escaped(long_log, client):
    owner, task = long_log
    client.force_login(owner)

    response = client.get(f"/jobs/{task.job_id}/tasks/{task.pk}/log/")

    assert response.streaming and response.status_code == 200
    page = streamed(response).decode()
    body = page.split('<pre class="log">')[1].split("</pre>")[0]
    assert body == "".join(
        f'<span class="{"stderr" if seq == 6 else "stdout"}">line {seq} &lt;b&gt;</span>\n' for seq in range(7)
    )
    assert "Back to the job" in page.split('<pre class="log">')[0]


def test_the_log_download_streams_the_whole_log(long_log, client):
    owner, task = long_log
    client.force_login(owner)

    response = client.get(f"/api/jobs/{task.job_id}/logs/{task.pk}/?download=1")

    assert response.streaming and response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="job{task.job_id}-worker0-attempt1.log"'
    text = streamed(response).decode()
    assert text == "".join(f"line {seq} <b>\n" for seq in range(7))


def test_an_empty_log_says_so(running, client):
    owner, _host, _token, _job, task = running
    client.force_login(owner)

    page = streamed(client.get(f"/jobs/{task.job_id}/tasks/{task.pk}/log/")).decode()
    assert '<pre class="log">No output yet.</pre>' in page
