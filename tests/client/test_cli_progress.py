"""Progress in the terminal (issue 45): `tfdash ls` has a progress column ("epoch 3/10 · ETA 2 min"), `tfdash status`
and the end of `tfdash wait` a progress line, `--wait`'s live line the same words; the ETA only while the job runs.
The real command, in process, against the real API (tests/client/test_cli_verdict.py's harness)."""

from __future__ import annotations

import time

import pytest
from rich.console import Console
from tfdash import cli_output
from tfdash.job_progress import progress_text
from tfdash.progress import JobWatch

from orchestrator.models import Job
from tests import factories
from tests.client.test_cli_verdict import in_process_client, run_cli

pytestmark = pytest.mark.django_db(transaction=True)  # each WSGI request closes the connection at its end

PROGRESS = {"epoch": 3, "epochs": 10, "step": 90, "steps": 300, "examples_per_s": 1234.5, "eta_s": 150.0,
            "resumed_from_epoch": 0}  # fmt: skip
FULL = "epoch 3/10 · step 90/300 · 1,234 examples/s"


def a_job(owner, state: str, progress: dict) -> Job:
    cluster = factories.cluster()
    return Job.objects.create(owner=owner, cluster=cluster, name="j", strategy="mirrored", program_kind="script",
                              state=state, progress=progress, attempt=1)  # fmt: skip


def test_ls_and_status_show_the_progress_and_the_eta_while_it_runs(alice, monkeypatch):
    # rich's table on one line per job: the CLI's console read COLUMNS when it was made (at import, perhaps under
    # another test's environment), so its width is set here.
    monkeypatch.setattr(cli_output.out, "width", 200)
    running = a_job(alice, "running", {**PROGRESS, "at": time.time() - 30})
    a_job(alice, "queued", {})

    code, printed = run_cli(alice, monkeypatch, "ls")
    assert code == 0
    row = next(line for line in printed.splitlines() if line.strip().startswith(str(running.pk)))
    assert "epoch 3/10 · ETA 2 min" in row  # 150 s as of 30 s ago
    code, printed = run_cli(alice, monkeypatch, "status", str(running.pk))
    assert code == 0 and f"  progress: {FULL} · ETA 2 min" in printed.splitlines()


def test_wait_shows_the_progress_live_and_at_the_end_without_an_eta(alice, monkeypatch):
    ended = a_job(alice, "succeeded", {**PROGRESS, "epoch": 10, "step": 300, "eta_s": 0.0, "at": time.time()})

    code, printed = run_cli(alice, monkeypatch, "wait", str(ended.pk))
    assert code == 0
    assert "  progress: epoch 10/10 · step 300/300 · 1,234 examples/s" in printed.splitlines()

    live = a_job(alice, "running", {**PROGRESS, "at": time.time()})
    api = in_process_client(alice)
    watch = JobWatch(api, live.pk, Console())
    assert f"{FULL} · ETA 2 min" in watch.line(api.job(live.pk), plain=True)


def test_the_command_says_what_the_server_says_and_nothing_before_the_first_epoch(alice):
    api = in_process_client(alice)
    unknown = {"epoch": 2, "epochs": None, "step": 7, "steps": None, "examples_per_s": None, "eta_s": None, "at": 1.0}
    assert progress_text(api.job(a_job(alice, "running", {}).pk)) == ""
    assert progress_text(api.job(a_job(alice, "running", unknown).pk)) == "epoch 2"
    old = a_job(alice, "running", {**PROGRESS, "at": 100.0})
    assert progress_text(api.job(old.pk)) == f"{FULL} · ETA 0 s"
    assert progress_text(api.job(old.pk), short=True) == "epoch 3/10 · ETA 0 s"
