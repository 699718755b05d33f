"""What `make run` starts, in order (`Stack`): PostgreSQL and Redis (found, or embedded: scripts/local_services.py),
the migrations, an admin and a local cluster, then the web server, the orchestrator, the scheduler and webhook
workers, the metrics ingest and one agent per local host (each a child: scripts/local_children.py), and what the
agents' environment leaves out of the control plane's.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(1, str(ROOT))

import var_lock  # noqa: E402 - after the path
from celery_workers import worker_argv  # noqa: E402 - after the path
from local_children import Child, Children, tethered  # noqa: E402 - after the path
from local_services import (  # noqa: E402 - after the path
    EmbeddedPostgres,
    EmbeddedRedis,
    control_key_file,
    secret_file,
    wait_for,
)

from contracts.broker import without_credentials  # noqa: E402 - after the path

PY = sys.executable
# What the local agents' environment leaves out: the control plane's own secrets, and its Django settings (the agent
# imports no Django; with DJANGO_SETTINGS_MODULE set, Celery would load the control plane's settings into it).
NOT_FOR_AGENTS = frozenset(
    {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "TFDASH_CONTROL_KEY", "TFDASH_CONTROL_KEY_FILE",
     "DJANGO_SUPERUSER_PASSWORD", "DJANGO_SETTINGS_MODULE"}
)  # fmt: skip
TASK_UIDS_ENV = "TFDASH_TASK_UIDS"  # set it (even empty) to choose the local agents' task uids yourself
LOCAL_TASK_UIDS = "20000-29999"
# The scheduler's session runs at this CPU nice where allowed (session_nice): a pass is one thread the whole fleet
# waits on, using a few percent of a core between passes, and on a machine the rest of the control plane fills it
# waited for a core a third of its time (docs/sizing.md).
SCHEDULER_NICE = -10


def not_root_notice(var: Path) -> str | None:
    """What `make run` says first when it is not root: then nothing separates a job's tasks from the control plane."""
    uid = os.geteuid()
    if uid == 0:
        return None
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = f"uid {uid}"
    return (
        f"Not running as root: every job's tasks run as {user}, the user the web server, the orchestrator and the "
        f"agents run as, so any job's script can read all of {var}/ (the secret key, the control key, the database "
        "and Redis passwords, the database itself) and every other job's files. Run it as root to give each job a "
        "uid of its own (docs/security/index.md)."
    )


class Stack:
    def __init__(self) -> None:
        self.var = Path(os.environ.get("TFDASH_VAR_DIR", ROOT / "var"))
        # Before anything is started or written: a second run on this folder stops here, naming the first.
        self.lock = var_lock.hold(self.var)
        self.logs = self.var / "log"
        # Logs may name hosts, paths and jobs: readable by the operator (and root) alone.
        self.logs.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.logs.chmod(0o700)
        self.children = Children(self.logs, self.say, self.lock.fileno())
        self.env = dict(os.environ)
        self.env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env["TFDASH_VAR_DIR"] = str(self.var)
        # The settings are safe by default (DEBUG off, no built-in SECRET_KEY); the local quick start is a
        # development stack on loopback, with a key of its own generated once into var/ (mode 0600).
        self.env.setdefault("DEBUG", "1")
        if not self.env.get("SECRET_KEY"):
            self.env["SECRET_KEY"] = secret_file(self.var / "secret-key")
        if not self.env.get("TFDASH_CONTROL_KEY_FILE") and not self.env.get("TFDASH_CONTROL_KEY"):
            # The key that signs every order to an agent: generated once (mode 0600), kept out of the database.
            self.env["TFDASH_CONTROL_KEY_FILE"] = str(control_key_file(self.var / "control-key"))

    def say(self, text: str) -> None:
        print(f"[run] {text}", flush=True)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None, **options: Any) -> Child:
        return self.children.start(name, argv, env or self.env, **options)

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            tethered([PY, "manage.py", *args], f"manage.py {args[0]}", childless=True),
            cwd=ROOT, env=self.env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise SystemExit(f"manage.py {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result.stdout

    def ensure_redis(self) -> None:
        """The Redis named by REDIS_URL when one answers there (its user must be allowed ACL commands: the control
        plane creates a user per host), else an embedded Valkey with ACLs on, on that URL's port (TFDASH_REDIS_PORT,
        16379, when REDIS_URL is unset: a system Redis on 6379 is not ours)."""
        import redis

        url = self.env.get("REDIS_URL", "")
        if url:
            try:
                redis.Redis.from_url(url, socket_connect_timeout=1).ping()
                self.say(f"Redis answers at {without_credentials(url)}")
                return
            except redis.RedisError:
                pass
        parsed = urlparse(url or f"redis://127.0.0.1:{os.environ.get('TFDASH_REDIS_PORT', '16379')}/0")
        if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit(f"No Redis answers at {url}, and it is not on this machine: start it, or unset REDIS_URL")
        server = EmbeddedRedis(self.var / "redis", parsed.port or 6379, password_file=self.var / "redis-password")
        self.start("redis", server.argv(), stops_last=True)
        url = server.url(parsed.path.lstrip("/") or "0")
        self.env["REDIS_URL"] = url

        def answers() -> bool:
            try:
                return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
            except redis.RedisError:
                return False

        wait_for(answers, 15, "The embedded Redis", self.logs / "redis.log")
        self.say(f"Started an embedded Redis (valkey, ACLs on) at 127.0.0.1:{server.port}")

    def ensure_postgres(self) -> None:
        """The database named by DATABASE_URL, else an embedded PostgreSQL under var/postgres."""
        if self.env.get("DATABASE_URL"):
            self.say("Using the database at DATABASE_URL")
            return
        if (self.var / "db.sqlite3").exists():
            self.say(f"{self.var / 'db.sqlite3'} is from an older version and is no longer used (PostgreSQL only now)")
        server = EmbeddedPostgres(self.var)
        server.prepare()
        self.start("postgres", server.argv(), stops_last=True, **server.popen_options())
        wait_for(server.answers, 60, "The embedded PostgreSQL", self.logs / "postgres.log")
        server.ensure_database()
        self.env["DATABASE_URL"] = server.url
        self.say(f"Started an embedded PostgreSQL at 127.0.0.1:{server.port} (data in {server.data})")

    def agent_env(self) -> dict[str, str]:
        """What the local agents run with: none of the control plane's secrets (a task that could read its agent's
        environment would find nothing of the control plane's), the broker URL by environment, not on the command
        line (any local user reads command lines), and, as root, each job's tasks under a uid of its own."""
        env = {k: v for k, v in self.env.items() if k not in NOT_FOR_AGENTS}
        # The broker's address alone: an agent signs in as its host's own user, with a password derived from its token.
        env["TFDASH_SERVER"] = without_credentials(self.env["REDIS_URL"])
        if os.geteuid() == 0 and TASK_UIDS_ENV not in env:
            from worker_agent.supervision import identity

            problem = identity.task_uids_problem(identity.parse_range(LOCAL_TASK_UIDS), self.var)
            if problem is None:
                env[TASK_UIDS_ENV] = LOCAL_TASK_UIDS
                self.say(f"tasks run under a uid of their own job ({LOCAL_TASK_UIDS})")
            else:
                self.say(f"tasks run as root: {problem}")
        return env

    def wait_for_web(self, url: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.children.tend()
            try:
                with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - our own local URL
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.3)
        raise SystemExit(f"The web server did not answer at {url} within {timeout_s:.0f} s; see var/log/web.log")

    def stop_all(self) -> None:
        self.children.stop_all()

    def run(self) -> None:
        notice = not_root_notice(self.var)
        if notice:
            self.say(notice)
        port = int(os.environ.get("PORT", "8000"))
        bind = os.environ.get("BIND", "127.0.0.1")
        self.ensure_postgres()
        self.ensure_redis()
        self.say("Migrating the database ...")
        self.manage("migrate", "--noinput")
        admin_line = self.manage("ensure_admin").strip()
        # The cluster's default task environment is the venv `make install` made (its TensorFlow), by the venv's own
        # path: resolving the link would name the system Python, which has none.
        setup = ["--hosts", os.environ.get("LOCAL_HOSTS", "2"), "--shared-dir", str(self.var / "shared")]
        cluster = json.loads(self.manage("local_cluster", *setup, "--environment", str(Path(PY).absolute())))

        self.start("web", [PY, "-m", "daphne", "-b", bind, "-p", str(port), "config.asgi:application"], childless=True)
        self.start(
            "orchestrator",
            worker_argv(
                "orchestrator", 4, "orchestrator@%h", beat_schedule=self.var / "celerybeat-schedule", python=PY
            ),
        )
        # Scheduler passes in a process of their own: a pass then shares no interpreter lock with the hosts' events
        # (docs/sizing.md: at fleet size that was the difference between 972 and 1,209 tasks/s placed).
        self.start(
            "scheduler",
            worker_argv("scheduler", 1, "scheduler@%h", python=PY),
            nice=SCHEDULER_NICE, childless=True,  # a thread pool: no process of its own
        )  # fmt: skip
        # Webhook deliveries in a worker of their own: a slow receiver holds none of the orchestrator's threads (one
        # sweep at a time, its POSTs in a bounded pool of their own: orchestrator/webhooks/delivering.py).
        self.start("webhooks", worker_argv("webhooks", 1, "webhooks@%h", python=PY), childless=True)
        # The one consumer of the metric stream (point ids then grow in commit order).
        self.start("ingest", [PY, "manage.py", "ingest_metrics"], childless=True)
        agent_env = self.agent_env()
        shared = self.var / "shared"  # the local cluster's shared folder: the agents make job folders only there
        shared.mkdir(exist_ok=True)
        for host in cluster["hosts"]:
            # The token by environment (the agent drops it from its own at once), never by flag (`ps` shows flags).
            self.start(
                f"agent-{host['host']}",
                [PY, "-m", "worker_agent", "--host", host["host"], "--control-key", cluster["control_key"],
                 "--port-range", host["port_range"], "--heartbeat-interval", "2",
                 "--workdir", str(self.var / "agents" / host["host"]), "--shared-root", str(shared)],
                {**agent_env, "TFDASH_AGENT_TOKEN": host["token"]},
            )  # fmt: skip
        url = f"http://{'127.0.0.1' if bind in ('0.0.0.0', '::') else bind}:{port}/"  # noqa: S104
        self.wait_for_web(url + "accounts/login/")
        self.say(f"tfdash is up: {url}")
        self.say(f"sign in as {admin_line.removeprefix('admin: ')}")
        self.say(f"local cluster: {', '.join(h['host'] for h in cluster['hosts'])}; logs in {self.logs}/")
        self.say("Ctrl-C stops everything; a part that exits is started again.")
        while True:
            self.children.tend()
            time.sleep(0.5)
