"""The verdict in the terminal (issue 45): `tfdash status` prints a failed job's diagnosis (title, message, hint), and
`tfdash wait` (the end of `submit --wait` too) prints it as its last line, made by the server when the job's own has
not landed yet; a job without one prints none. The real command, in process, against the real API (httpx's WSGI
transport): what the server stores is what the terminal shows, its terminal escapes stripped."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import httpx
import pytest
from django.core.wsgi import get_wsgi_application
from tfdash import cli
from tfdash.client import Client

from orchestrator.identity import api_tokens
from orchestrator.models import Job, Task, TaskLogLine
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)  # each WSGI request closes the connection at its end

DIAGNOSIS = {
    "kind": "user_exception",
    "title": "worker 1 raised ValueError",
    "message": "worker 1 on node-1 raised ValueError: bad shape [bold]x[/] in train.py:42\x1b]0;pwned\x07",
    "hint": "Fix the error at train.py:42; the other workers stopped because worker 1 did.",
    "task": "worker 1 on node-1",
    "task_id": None,
    "evidence": ["ValueError: bad shape"],
    "peers": [],
    "at": "2026-11-27T23:00:00+00:00",
    "lines_in": 0,  # the log lines it was made from (the task has none taken in): the server keeps it as it is
}
SHOWN_MESSAGE = "worker 1 on node-1 raised ValueError: bad shape [bold]x[/] in train.py:42"  # markup literal, no OSC
LAST_LINE = f"failed: {SHOWN_MESSAGE}. What to do: {DIAGNOSIS['hint']}"


def a_job(owner: Any, state: str, diagnosis: dict[str, Any]) -> Job:
    host, _token = factories.host()
    host.save()
    job = Job.objects.create(owner=owner, cluster=host.cluster, name="j", strategy="multi_worker_mirrored",
                             program_kind="script", workers=2, attempt=1, state=state, diagnosis=diagnosis)  # fmt: skip
    Task.objects.create(job=job, attempt=1, type="worker", index=1, host=host, state=state, exit_code=1)
    return job


def run_cli(alice: Any, monkeypatch: pytest.MonkeyPatch, *args: str, api: Client | None = None) -> tuple[int, str]:
    """`tfdash ARGS`: its exit code and what it printed on its standard output."""
    api = api or in_process_client(alice)
    monkeypatch.setattr(cli.Client, "from_config", classmethod(lambda _cls, _url: api))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = cli.main(list(args))
    return code, printed.getvalue()


def in_process_client(alice: Any) -> Client:
    token = api_tokens.issue(alice)[0]
    return Client("http://testserver", token, transport=httpx.WSGITransport(app=get_wsgi_application()))


def test_status_prints_the_verdicts_title_message_and_hint(alice, monkeypatch):
    job = a_job(alice, "failed", DIAGNOSIS)

    code, printed = run_cli(alice, monkeypatch, "status", str(job.pk))

    assert code == 0
    lines = [line.strip() for line in printed.splitlines()]
    why = lines.index("why: worker 1 raised ValueError")
    assert lines[why + 1] == SHOWN_MESSAGE
    assert lines[why + 2] == f"what to do: {DIAGNOSIS['hint']}"
    assert "pwned" not in printed and "\x1b" not in printed


def test_wait_ends_with_the_verdict_as_its_last_line(alice, monkeypatch):
    job = a_job(alice, "failed", DIAGNOSIS)

    code, printed = run_cli(alice, monkeypatch, "wait", str(job.pk))

    assert code == 1  # the job failed
    assert printed.splitlines()[-1] == f"why job {job.pk} {LAST_LINE}"
    assert printed.count(SHOWN_MESSAGE) == 1  # once, last: not also in the job's block above it
    code, printed = run_cli(alice, monkeypatch, "wait", str(job.pk), "--json")
    assert code == 1 and json.loads(printed)["diagnosis"]["title"] == DIAGNOSIS["title"]


def test_wait_on_a_job_whose_verdict_is_not_made_yet_gets_it_made_by_the_server(alice, monkeypatch):
    job = a_job(alice, "failed", {})  # its end's after-commit verdict has not landed
    task = job.tasks.get()
    lines = ["Traceback (most recent call last):", '  File "/jobs/1/train.py", line 3, in <module>',
             "ModuleNotFoundError: No module named 'tensorflow_addons'"]  # fmt: skip
    TaskLogLine.objects.bulk_create(TaskLogLine(task=task, seq=i, stream="stderr", text=t) for i, t in enumerate(lines))

    code, printed = run_cli(alice, monkeypatch, "wait", str(job.pk))

    assert code == 1
    assert printed.splitlines()[-1].startswith(
        f"why job {job.pk} failed: {task.label} could not import tensorflow_addons at train.py:3"
    )


def test_a_job_without_a_verdict_prints_none(alice, monkeypatch):
    succeeded = a_job(alice, "succeeded", {})
    timed_out = a_job(alice, "timed_out", {**DIAGNOSIS, "message": "", "hint": "", "title": "time limit reached"})

    code, printed = run_cli(alice, monkeypatch, "wait", str(succeeded.pk))
    assert code == 0 and "why" not in printed
    assert "why" not in run_cli(alice, monkeypatch, "status", str(succeeded.pk))[1]
    code, printed = run_cli(alice, monkeypatch, "wait", str(timed_out.pk))
    assert code == 9 and printed.splitlines()[-1] == f"why job {timed_out.pk} timed_out: time limit reached"
