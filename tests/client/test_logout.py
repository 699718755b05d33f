"""`tfdash login` / `tfdash logout` against a real web server (Daphne): each login gets a token of its own, named for
the machine; logout revokes its token on the server (a copy of the config file signs nothing in afterwards) before
forgetting it, keeps it when the server cannot be reached (so the logout can be run again), and an expired token is
refused with the server's reason and exit code 3."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.utils import timezone

from orchestrator.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)

TFDASH = Path(sys.executable).with_name("tfdash")  # the client, as `make install` puts it in the venv
PASSWORD = "pw-alice-123"  # tests/conftest.py's alice


def _tfdash(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "COLUMNS": "200"}
    return subprocess.run(
        [str(TFDASH), *args], input=stdin, capture_output=True, text=True, env=env, cwd=home, timeout=60, check=False
    )


def _stored_token(home: Path) -> str:
    return str(json.loads((home / ".config" / "tfdash" / "config.json").read_text())["token"])


def _status_with(url: str, token: str) -> int:
    return httpx.get(f"{url}/api/jobs/", headers={"Authorization": f"Token {token}"}, timeout=30).status_code


def _login(home: Path, url: str) -> str:
    done = _tfdash(home, "login", url, "-u", "alice", "--password-stdin", stdin=PASSWORD + "\n")
    assert done.returncode == 0, done.stderr
    return _stored_token(home)


def test_logout_revokes_its_token_on_the_server_and_leaves_the_other_logins(web, alice, tmp_path):
    laptop, desktop = tmp_path / "laptop", tmp_path / "desktop"
    laptop.mkdir()
    desktop.mkdir()
    laptop_token = _login(laptop, web.url)
    desktop_token = _login(desktop, web.url)
    assert laptop_token != desktop_token
    assert set(ApiToken.objects.filter(user=alice).values_list("name", flat=True)) == {
        f"tfdash CLI on {socket.gethostname()}"
    }

    out = _tfdash(laptop, "logout")

    assert out.returncode == 0, out.stderr
    assert "revoked on the server" in out.stderr
    assert not (laptop / ".config" / "tfdash" / "config.json").exists()
    assert _status_with(web.url, laptop_token) == 401  # a copy of the file is worth nothing now
    assert _status_with(web.url, desktop_token) == 200
    assert _tfdash(desktop, "ls", "--json").returncode == 0


def test_logout_keeps_the_token_when_the_server_cannot_be_reached(web, alice, tmp_path):
    token = _login(tmp_path, web.url)
    web.stop()

    out = _tfdash(tmp_path, "logout")

    assert out.returncode == 6, out.stderr
    assert "not revoked and is kept" in out.stderr
    assert _stored_token(tmp_path) == token
    local = _tfdash(tmp_path, "logout", "--local")
    assert local.returncode == 0 and "still works on the server" in local.stderr
    assert not (tmp_path / ".config" / "tfdash" / "config.json").exists()


def test_an_expired_token_is_refused_with_the_servers_reason(web, alice, tmp_path):
    _login(tmp_path, web.url)
    ApiToken.objects.filter(user=alice).update(expires_at=timezone.now() - timedelta(minutes=1))

    out = _tfdash(tmp_path, "ls")

    assert out.returncode == 3
    assert "This token expired on" in out.stderr and "tfdash login" in out.stderr
