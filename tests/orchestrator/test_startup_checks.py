"""A control plane without a usable control key stops as it starts, saying why: `manage.py` commands (the ingest,
`check`, `migrate`), the web server (Daphne) and the orchestrator's Celery worker; not at the first order, token or
report, after looking healthy. With the key, they start as before."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.processes import ROOT

MESSAGE = "no usable control-plane signing key"
WITHOUT_KEY = {k: v for k, v in os.environ.items() if k not in ("TFDASH_CONTROL_KEY", "TFDASH_CONTROL_KEY_FILE")}


def run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env={**WITHOUT_KEY, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["manage.py", "check"], "manage.py check"),
        (["manage.py", "ingest_metrics"], "the ingest"),
        (["-m", "daphne", "-b", "127.0.0.1", "-p", "0", "config.asgi:application"], "the web server"),
        (["-m", "celery", "-A", "config", "worker", "-Q", "orchestrator", "--pool", "solo"], "the orchestrator"),
    ],
)
def test_without_a_control_key_each_control_plane_process_stops_at_start_saying_why(argv: list[str], what: str):
    result = run(argv)
    assert result.returncode != 0, f"{what} started without a control key:\n{result.stdout}{result.stderr}"
    assert MESSAGE in result.stdout + result.stderr, what
    assert "TFDASH_CONTROL_KEY" in result.stdout + result.stderr, what


def test_a_key_file_that_cannot_be_read_is_named():
    result = run(["manage.py", "check"], TFDASH_CONTROL_KEY_FILE="/nonexistent/control-key")
    assert result.returncode != 0
    assert "(tfdash.E001)" in result.stderr and "/nonexistent/control-key" in result.stderr


def test_a_key_that_is_not_a_key_is_refused():
    result = run(["manage.py", "check"], TFDASH_CONTROL_KEY="not-a-key")
    assert result.returncode != 0 and MESSAGE in result.stderr


def test_with_the_key_the_checks_pass_and_migrations_are_in_order():
    key_file = os.environ["TFDASH_CONTROL_KEY_FILE"]  # the suite's throwaway key (tests/settings.py)
    assert run(["manage.py", "check"], TFDASH_CONTROL_KEY_FILE=key_file).returncode == 0
    made = run(["manage.py", "makemigrations", "--check", "--dry-run"], TFDASH_CONTROL_KEY_FILE=key_file)
    assert made.returncode == 0, made.stdout + made.stderr
