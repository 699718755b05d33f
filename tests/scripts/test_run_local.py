"""The quick start for real: `scripts/run_local.py` (what `make run` calls) with no database and no Redis configured.

It must start an embedded PostgreSQL and an embedded Redis, migrate, create the admin, register two local hosts, and
within 60 s of the web answering show both hosts online with CPU count and memory; start a part that died again (and
say so) without touching the others; and SIGTERM must stop every process it started. SIGKILLed (its python, or the
`make` of `make run`), nothing it started may outlive it; and while it runs, a second one on its var/ refuses at once,
naming its pid. The supervising part (`Children`, `Backoff`) is also tested alone, with real child processes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from tests.support.ports import free_port
from tests.support.processes import ROOT, ManagedProcess, wait_until

sys.path.insert(0, str(ROOT / "scripts"))
# scripts/ is no package: found through the path above
import local_stack
from local_children import Backoff, Children, session_nice_of
from local_stack import SCHEDULER_NICE

OWN_SETTINGS = (
    "DATABASE_URL",
    "SECRET_KEY",
    "DEBUG",
    "TFDASH_CONTROL_KEY_FILE",
    "TFDASH_CONTROL_KEY",
    "TFDASH_TASK_UIDS",
)


def cmdline(process: psutil.Process) -> list[str]:
    """A child's command line; none for one gone meanwhile (PostgreSQL's backends come and go with connections)."""
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:
        return []


def program(process: psutil.Process) -> bool:
    """One of make run's programs, not a guard (scripts/tether.py) that stays between it and make run."""
    return not any(arg.endswith("scripts/tether.py") for arg in cmdline(process))


def quick_start_env(open_tmp, port: int, redis_port: int, pg_port: int) -> dict[str, str]:
    return {
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


def agent_log(var: Path) -> str:
    return "\n".join(f"{log.name}: {log.read_text()[-2500:]}" for log in sorted((var / "log").glob("agent*.log")))


def test_make_run_brings_up_two_online_hosts_and_stops_everything(open_tmp):
    port, redis_port, pg_port = free_port(), free_port(), free_port()
    env = quick_start_env(open_tmp, port, redis_port, pg_port)
    run = ManagedProcess("run_local", [sys.executable, "scripts/run_local.py"], env, cwd=ROOT)
    children: list[psutil.Process] = []
    try:
        run.wait_for_line(rf"Started an embedded PostgreSQL at 127.0.0.1:{pg_port}", timeout=60)
        run.wait_for_line(rf"Started an embedded Redis \(valkey, ACLs on\) at 127.0.0.1:{redis_port}", timeout=30)
        run.wait_for_line(rf"tfdash is up: http://127.0.0.1:{port}/", timeout=120)
        up_at = time.monotonic()
        children = psutil.Process(run.pid).children(recursive=True)
        programs = [c for c in children if program(c)]
        assert len(programs) >= 9  # postgres, redis, web, orchestrator, scheduler, webhooks, ingest, two agents
        workers = [" ".join(cmdline(c)) for c in programs if "celery" in " ".join(cmdline(c))]
        assert any("-Q scheduler " in argv for argv in workers), workers  # passes in a worker of their own
        assert any("-Q webhooks " in argv for argv in workers), workers  # and webhook deliveries
        if CAN_RAISE_SESSIONS:  # and first in line for a core
            scheduler = next(c for c in programs if "scheduler@" in " ".join(cmdline(c)))
            assert session_nice_of(scheduler.pid) == SCHEDULER_NICE

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
        # Its default task environment is the venv it runs from, and both agents find TensorFlow in it.
        assert [(e["name"], e["is_default"]) for e in cluster["environments"]] == [("local-venv", True)]

        seen: list[dict] = []

        def probed() -> list[dict] | None:
            seen[:] = [
                {"host": h["name"], **e} for h in api.get(hosts_url).json()["results"] for e in h["environments"]
            ]
            return seen if len(seen) == 2 and all(e["ok"] and e["tensorflow"] for e in seen) else None

        try:
            found = wait_until(probed, timeout=300, interval=0.5, what="both agents to probe local-venv")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; they reported: {seen}; agent log: {agent_log(open_tmp / 'var')}") from None
        assert {e["interpreter"] for e in found} == {str(Path(sys.executable).absolute())}

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
        agents = [c for c in programs if "worker_agent" in cmdline(c)]
        assert len(agents) == 2
        for guard in (agent.parent() for agent in agents):  # a guard passed the token on and kept no copy
            assert not program(guard) and guard.environ() == {}
        for agent in agents:
            environ = agent.environ()
            assert not [s for s in (secret_key, postgres_pw, redis_pw) if s in " ".join(agent.cmdline())]
            assert not [s for s in (secret_key, postgres_pw, redis_pw) if s in " ".join(environ.values())]
            assert environ["TFDASH_SERVER"] == f"redis://127.0.0.1:{redis_port}/0"
            if os.geteuid() == 0:
                assert environ["TFDASH_TASK_UIDS"] == "20000-29999"
        if os.geteuid() == 0:
            assert "tasks run under a uid of their own job (20000-29999)" in run.output()

        # One part dies (the orchestrator, SIGKILL, with its group): it alone is started again, and the line says so.
        orchestrator = next(c for c in programs if "orchestrator@" in " ".join(cmdline(c)))
        os.killpg(os.getpgid(orchestrator.pid), signal.SIGKILL)
        run.wait_for_line(r"orchestrator exited with code -9; restarting in 1 s", timeout=15)
        run.wait_for_line(r"orchestrator restarted \(pid \d+\)", timeout=15)
        log = var / "log" / "orchestrator.log"
        wait_until(lambda: log.read_text().count(" ready.") >= 2, timeout=60, what="the new orchestrator ready")
        assert api.get(hosts_url).status_code == 200
        assert all(agent.is_running() for agent in agents)  # the same processes: nothing else was restarted
        children = psutil.Process(run.pid).children(recursive=True)

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


def test_make_run_sigkilled_leaves_nothing_running_and_a_var_in_use_is_refused(open_tmp):
    """The scenario seen: `make run` killed outright, and the next one started beside what it left. Now: while one
    runs, a second on its var/ refuses at once, naming its pid; its python SIGKILLed, every process it had started
    ends; then `make run` on the same var/ starts (the lock file left behind blocks nothing), and SIGKILL of its
    `make` takes everything along too."""
    port, redis_port, pg_port = free_port(), free_port(), free_port()
    env = quick_start_env(open_tmp, port, redis_port, pg_port)
    runs: list[ManagedProcess] = []
    started: list[psutil.Process] = []
    try:
        first = ManagedProcess("run_local", [sys.executable, "scripts/run_local.py"], env, cwd=ROOT)
        runs.append(first)
        first.wait_for_line(rf"tfdash is up: http://127.0.0.1:{port}/", timeout=180)

        second = subprocess.run(
            [sys.executable, "scripts/run_local.py"], cwd=ROOT, env={**env, "PORT": str(free_port())},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert second.returncode == 1, second
        var = open_tmp / "var"
        assert second.stderr.strip() == (
            f"[run] {var} is in use by another `make run` (pid {first.pid}): stop it first (Ctrl-C where it runs, or "
            f"`kill {first.pid}`), or give this one a folder of its own (TFDASH_VAR_DIR=...); nothing was started."
        )
        assert second.stdout == ""

        started = psutil.Process(first.pid).children(recursive=True)
        assert len([p for p in started if program(p) and "worker_agent" in cmdline(p)]) == 2
        os.kill(first.pid, signal.SIGKILL)  # its python alone: as the OOM killer, or `kill -9`, would
        assert first.proc.wait(timeout=30) == -signal.SIGKILL
        _all_end(started, "everything the SIGKILLed run had started")

        if shutil.which("make") is None:
            return
        # `make run` as a person types it (VENV: the suite's interpreter; -o: no reinstall for a newer pyproject.toml)
        make = [shutil.which("make"), "-o", f"{sys.prefix}/.installed", f"VENV={sys.prefix}", "run"]
        third = ManagedProcess("make run", make, env, cwd=ROOT)
        runs.append(third)
        third.wait_for_line(rf"Started an embedded PostgreSQL at 127.0.0.1:{pg_port}", timeout=60)
        third.wait_for_line(rf"tfdash is up: http://127.0.0.1:{port}/", timeout=180)
        started = psutil.Process(third.pid).children(recursive=True)
        assert len([p for p in started if program(p) and "worker_agent" in cmdline(p)]) == 2
        os.kill(third.pid, signal.SIGKILL)  # make alone: its python must stop all the same
        _all_end(started, "everything `make run` had started, make SIGKILLed")
        wait_until(lambda: "[run] stopped." in third.output(), timeout=60, what="its orderly stop's last line")
    finally:
        for run in runs:
            run.stop()
        for process in started:  # only reached alive when an assertion above failed half-way
            with contextlib.suppress(psutil.Error):
                process.kill()


def _all_end(processes: list[psutil.Process], what: str) -> None:
    """Every one of `processes` ends within a deadline: a guard's grace (GRACE_S) and its SIGKILL, on a loaded
    machine."""

    def left() -> list[str]:
        return [f"{p.pid} {' '.join(cmdline(p))[:120]}" for p in processes if _alive(p)]

    try:
        wait_until(lambda: not left(), timeout=90, interval=0.5, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still running:\n" + "\n".join(left())) from None


def test_make_run_not_as_root_says_first_that_tasks_run_as_the_web_servers_user_and_can_read_var(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    notice = local_stack.not_root_notice(tmp_path / "var")
    assert notice is not None
    assert notice.startswith("Not running as root: every job's tasks run as uid 4242, the user the web server")
    assert f"can read all of {tmp_path / 'var'}/" in notice and "the control key" in notice

    # It is the first thing `make run` says: before any database or Redis is looked for.
    monkeypatch.setenv("TFDASH_VAR_DIR", str(tmp_path / "var"))
    stack = local_stack.Stack()
    said: list[str] = []
    monkeypatch.setattr(stack, "say", said.append)

    def stop_here() -> None:
        raise SystemExit("stopped before the database")

    monkeypatch.setattr(stack, "ensure_postgres", stop_here)
    with pytest.raises(SystemExit):
        stack.run()
    assert said == [notice]

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert local_stack.not_root_notice(tmp_path / "var") is None


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_child_that_exits_is_started_again_after_a_doubling_pause_and_the_others_run_on(tmp_path):
    said: list[str] = []
    children = Children(tmp_path, said.append)
    crasher = children.start("crasher", [sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ))
    steady = children.start("steady", [sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ))
    steady_pid = steady.proc.pid
    pauses = []
    try:
        for _ in range(7):
            crasher.proc.wait(timeout=30)
            now = crasher.started_at + 0.5  # it ran half a second: a crash loop
            children.tend(now)
            assert crasher.restart_at is not None
            pauses.append(crasher.restart_at - now)
            exited = crasher.proc
            children.tend(crasher.restart_at - 0.01)
            assert crasher.proc is exited  # not before its pause is over
            children.tend(crasher.restart_at)
            assert crasher.proc is not exited and crasher.restart_at is None
        # (restart_at - now: a float sum taken apart again; how many bits it keeps depends on the clock's value)
        assert pauses == pytest.approx([1, 2, 4, 8, 16, 30, 30], abs=1e-6)
        assert said[0] == f"crasher exited with code 3; restarting in 1 s (log: {tmp_path / 'crasher.log'})"
        assert re.fullmatch(r"crasher restarted \(pid \d+\)", said[1])
        assert [line.split(";")[0] for line in said[2::2]] == ["crasher exited with code 3"] * 6
        assert (steady.proc.pid, steady.proc.poll()) == (steady_pid, None)  # never touched
    finally:
        children.stop_all()
    assert steady.proc.poll() is not None
    assert crasher.proc.poll() is not None


def test_the_servers_stop_after_the_programs_that_talk_to_them(tmp_path):
    """An agent's last reports (its tasks' exits) must still find Redis: the servers get SIGTERM once the others
    ended. Each child writes its name when it gets SIGTERM; the program takes its time before it ends."""
    said = tmp_path / "stopped"

    def child(name: str, pause_s: float) -> list[str]:
        code = (
            "import signal, sys, time\n"
            "def stop(*_):\n"
            # Told once or twice (the guard passes SIGTERM on to its group as well): the first one is what counts.
            "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"    time.sleep({pause_s})\n"
            f"    open({str(said)!r}, 'a').write({name!r} + '\\n')\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            f"open({str(tmp_path / name)!r}, 'w').close()\n"
            "time.sleep(600)\n"
        )
        return [sys.executable, "-c", code]

    children = Children(tmp_path, lambda _line: None)
    children.start("redis", child("redis", 0), dict(os.environ), stops_last=True)
    children.start("agent", child("agent", 1), dict(os.environ))
    wait_until(lambda: (tmp_path / "redis").exists() and (tmp_path / "agent").exists(), timeout=60, what="both up")
    children.stop_all()
    assert list(dict.fromkeys(said.read_text().split())) == ["agent", "redis"]


# Autogroups (a session's CPU nice) exist on this kernel, and this user may raise one: root (or CAP_SYS_NICE).
CAN_RAISE_SESSIONS = os.path.exists("/proc/self/autogroup") and os.geteuid() == 0


def test_a_child_started_at_a_session_nice_keeps_it_across_restarts_and_the_others_keep_theirs(tmp_path):
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("this kernel has no autogroups: a session's nice does not exist")
    children = Children(tmp_path, lambda _line: None)
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    first = children.start("first", sleep, dict(os.environ), nice=-5)
    other = children.start("other", sleep, dict(os.environ))
    try:
        expected = -5 if CAN_RAISE_SESSIONS else 0  # not allowed: it runs as every other process, no failure
        assert session_nice_of(first.proc.pid) == expected
        first.restart()
        assert session_nice_of(first.proc.pid) == expected
        assert session_nice_of(other.proc.pid) == 0
    finally:
        children.stop_all()


def test_the_pause_starts_over_once_a_child_ran_a_while():
    backoff = Backoff(first_s=1, most_s=30, stable_s=60)

    assert [backoff.after_exit(ran_s=2) for _ in range(3)] == [1, 2, 4]
    assert backoff.after_exit(ran_s=3600) == 1  # an hour up: not a crash loop
    assert backoff.after_exit(ran_s=2) == 2
