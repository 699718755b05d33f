"""The quick start for real: `scripts/run_local.py` (what `make run` calls) with no database and no Redis configured.

It must start an embedded PostgreSQL and an embedded Redis, migrate, create the admin, register two local hosts, and
within 60 s of the web answering show both hosts online with CPU count and memory; SIGTERM must stop every process it
started.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
import time

import psutil
import pytest
import requests

from tests.support.processes import ROOT, ManagedProcess, wait_until

OWN_SETTINGS = (
    "DATABASE_URL",
    "SECRET_KEY",
    "DEBUG",
    "TFDASH_CONTROL_KEY_FILE",
    "TFDASH_CONTROL_KEY",
    "TFDASH_TASK_UIDS",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_make_run_brings_up_two_online_hosts_and_stops_everything(open_tmp):
    port, redis_port, pg_port = free_port(), free_port(), free_port()
    env = {
        # No DATABASE_URL: the embedded PostgreSQL must start; no SECRET_KEY, DEBUG, control key or task uids: make run
        # brings its own.
        **{k: v for k, v in os.environ.items() if k not in OWN_SETTINGS},
        "PORT": str(port),
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",  # nothing listens there: the embedded one must start
        "TFDASH_PG_PORT": str(pg_port),
        "TFDASH_VAR_DIR": str(open_tmp / "var"),  # open_tmp: a folder task uids can enter, as a checkout's var/ is
        "DJANGO_SUPERUSER_USERNAME": "quickstart",
        "DJANGO_SUPERUSER_PASSWORD": "quick-start-pw-1",
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    run = ManagedProcess("run_local", [sys.executable, "scripts/run_local.py"], env, cwd=ROOT)
    children: list[psutil.Process] = []
    try:
        run.wait_for_line(rf"Started an embedded PostgreSQL at 127.0.0.1:{pg_port}", timeout=60)
        run.wait_for_line(rf"Started an embedded Redis \(valkey, ACLs on\) at 127.0.0.1:{redis_port}", timeout=30)
        run.wait_for_line(rf"tfdash is up: http://127.0.0.1:{port}/", timeout=120)
        up_at = time.monotonic()
        children = psutil.Process(run.pid).children(recursive=True)
        assert len(children) >= 7  # postgres, redis, web, orchestrator, ingest, two agents

        api = requests.Session()
        token = api.post(
            f"http://127.0.0.1:{port}/api/token/",
            data={"username": "quickstart", "password": "quick-start-pw-1"},
        ).json()["token"]
        api.headers["Authorization"] = f"Token {token}"
        cluster = next(c for c in api.get(f"http://127.0.0.1:{port}/api/clusters/").json()["results"])
        hosts_url = f"http://127.0.0.1:{port}/api/clusters/{cluster['id']}/hosts/"

        def both_online() -> list[dict] | None:
            hosts = api.get(hosts_url).json()["results"]
            ready = [h for h in hosts if h["status"] == "online" and h["cpu_count"] and h["memory_total_mb"]]
            return hosts if len(ready) == 2 else None

        hosts = wait_until(both_online, timeout=60, interval=0.5, what="both local hosts online")
        assert time.monotonic() - up_at < 60
        assert sorted(h["name"] for h in hosts) == ["local-1", "local-2"]
        assert {(h["port_min"], h["port_max"]) for h in hosts} == {(23000, 23099), (23100, 23199)}

        # Its secrets and its database are the operator's alone.
        var = open_tmp / "var"
        for secret in ("secret-key", "control-key", "redis-password", "postgres-password"):
            assert stat.S_IMODE((var / secret).stat().st_mode) == 0o600, secret
        for folder in ("postgres", "redis", "log"):
            assert stat.S_IMODE((var / folder).stat().st_mode) == 0o700, folder

        # The agents hold none of the control plane's secrets, its broker password included (an agent signs in as its
        # host's own Redis user, with a password derived from its token); the broker's address reaches them by
        # environment; and as root they run each job's tasks under a uid of its own, which cannot read the agent's
        # environment.
        secret_key, postgres_pw = ((var / name).read_text().strip() for name in ("secret-key", "postgres-password"))
        redis_pw = (var / "redis-password").read_text().strip()
        agents = [c for c in children if "worker_agent" in _cmdline(c)]
        assert len(agents) == 2
        for agent in agents:
            environ = agent.environ()
            assert not [s for s in (secret_key, postgres_pw, redis_pw) if s in " ".join(agent.cmdline())]
            assert not [s for s in (secret_key, postgres_pw, redis_pw) if s in " ".join(environ.values())]
            assert environ["TFDASH_SERVER"] == f"redis://127.0.0.1:{redis_port}/0"
            if os.geteuid() == 0:
                assert environ["TFDASH_TASK_UIDS"] == "20000-29999"
        if os.geteuid() == 0:
            assert "tasks run under a uid of their own job (20000-29999)" in run.output()

        os.killpg(run.pid, signal.SIGTERM)
        assert run.proc.wait(timeout=30) == 0
        gone = wait_until(
            lambda: not [c for c in children if _alive(c)],
            timeout=15,
            what="every started process to exit",
        )
        assert gone
        assert "stopped." in run.output()
    finally:
        run.stop()
        for child in children:  # only reached when an assertion above failed half-way
            if child.is_running():
                child.kill()


def _run_local_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_local", ROOT / "scripts" / "run_local.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_run_not_as_root_says_first_that_tasks_run_as_the_web_servers_user_and_can_read_var(monkeypatch, tmp_path):
    run_local = _run_local_module()
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    notice = run_local.not_root_notice(tmp_path / "var")
    assert notice is not None
    assert notice.startswith("Not running as root: every job's tasks run as uid 4242, the user the web server")
    assert f"can read all of {tmp_path / 'var'}/" in notice and "the control key" in notice

    # It is the first thing `make run` says: before any database or Redis is looked for.
    monkeypatch.setenv("TFDASH_VAR_DIR", str(tmp_path / "var"))
    stack = run_local.Stack()
    said: list[str] = []
    monkeypatch.setattr(stack, "say", said.append)

    def stop_here() -> None:
        raise SystemExit("stopped before the database")

    monkeypatch.setattr(stack, "ensure_postgres", stop_here)
    with pytest.raises(SystemExit):
        stack.run()
    assert said == [notice]

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert run_local.not_root_notice(tmp_path / "var") is None


def _cmdline(process: psutil.Process) -> list[str]:
    """Its command line; none for a short-lived child (a start-up probe, a migration) that ended meanwhile."""
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:
        return []


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
