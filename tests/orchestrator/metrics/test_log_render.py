"""Every read path shows a tf_keras progress bar at its last state (contracts/terminal_text.py) and keeps the stored
text for who asks for it raw: the task log page, the download, the API's lines, the job page's tail, the failure tail
and the task's `log_tail` in the API. The lines are a real tf_keras fit's stdout as the agent stores them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.models import TaskLogLine
from tests.support.streaming import streamed

pytestmark = pytest.mark.django_db

FIXTURE = Path(__file__).parents[2] / "contracts" / "fixtures" / "tf_keras_fit_verbose1.stdout"
SHOWN = [
    "Epoch 1/2",
    "70/70 [==============================] - 1s 2ms/step - loss: 12.6202 - mae: 3.4565",
    "Epoch 2/2",
    "70/70 [==============================] - 0s 1ms/step - loss: 4.8867 - mae: 2.0863",
]


@pytest.fixture
def fit_log(running: Any) -> tuple[Any, Any, list[str]]:
    """(owner, task, raw lines): the task's stdout holds the fit's output as the agent cuts and stores it."""
    owner, _host, _token, _job, task = running
    raw = FIXTURE.read_bytes().decode().split("\n")[:-1]  # the agent cuts at newlines (and strips a \r before one)
    TaskLogLine.objects.bulk_create(
        TaskLogLine(task=task, seq=seq, stream="stdout", text=text) for seq, text in enumerate(raw)
    )
    assert any("\x08" in text for text in raw)
    return owner, task, raw


def test_the_task_log_page_shows_each_bar_at_its_last_state(fit_log, client):
    owner, task, _raw = fit_log
    client.force_login(owner)

    page = streamed(client.get(f"/jobs/{task.job_id}/tasks/{task.pk}/log/")).decode()

    body = page.split('<pre class="log">')[1].split("</pre>")[0]
    assert body == "".join(f'<span class="stdout">{text}</span>\n' for text in SHOWN)
    assert f"/api/jobs/{task.job_id}/logs/{task.pk}/?download=1&amp;raw=1" in page  # the raw text is a link away


def test_the_download_is_rendered_and_raw_on_request(fit_log, client):
    owner, task, raw = fit_log
    client.force_login(owner)
    url = f"/api/jobs/{task.job_id}/logs/{task.pk}/?download=1"

    shown = client.get(url)
    as_written = client.get(url + "&raw=1")

    assert streamed(shown).decode() == "".join(f"{text}\n" for text in SHOWN)
    assert shown["Content-Disposition"] == f'attachment; filename="job{task.job_id}-worker0-attempt1.log"'
    assert streamed(as_written).decode() == "".join(f"{text}\n" for text in raw)
    assert as_written["Content-Disposition"] == f'attachment; filename="job{task.job_id}-worker0-attempt1.raw.log"'
    assert (FIXTURE.read_bytes()) == streamed(client.get(url + "&raw=1"))  # byte for byte what the task wrote


def test_the_api_lines_are_rendered_and_raw_on_request(fit_log, client):
    owner, task, raw = fit_log
    client.force_login(owner)
    url = f"/api/jobs/{task.job_id}/logs/{task.pk}/lines/"

    shown = client.get(url).json()
    as_written = client.get(url, {"since": 0, "raw": "true"}).json()

    assert [line["text"] for line in shown["lines"]] == SHOWN
    assert [line["seq"] for line in shown["lines"]] == [0, 1, 2, 3]
    assert [line["text"] for line in as_written["lines"]] == raw[1:]  # the cursor works as before
    assert as_written["next"] == 3


def test_another_user_gets_neither_the_rendered_nor_the_raw_log(fit_log, client, django_user_model):
    _owner, task, _raw = fit_log
    client.force_login(django_user_model.objects.create_user("mallory", password="pw-mallory-123"))

    for url in (f"/api/jobs/{task.job_id}/logs/{task.pk}/?raw=1", f"/api/jobs/{task.job_id}/logs/{task.pk}/lines/"):
        assert client.get(url).status_code == 404


def test_the_job_pages_tail_and_failure_tail_show_the_bars_last_state(fit_log, client):
    owner, task, _raw = fit_log
    job = task.job
    job.state, job.failed_task = "failed", task
    job.save()
    task.state, task.exit_code = "failed", 1
    task.save()
    client.force_login(owner)

    page = client.get(f"/jobs/{job.pk}/").content.decode()
    tail = client.get(f"/jobs/{job.pk}/log-tail/").content.decode()
    api = client.get(f"/api/jobs/{job.pk}/").json()

    for html in (page, tail):
        assert "\x08" not in html and "\r" not in html
        assert SHOWN[1] in html and SHOWN[3] in html
    assert json.dumps(api).count("\\b") == 0
    assert api["failure"]["log_tail"] == SHOWN
