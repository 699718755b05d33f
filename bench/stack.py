"""What every bench starts from: the product's stack on this machine, and the few helpers the benches share.

`Stack` (bench/chaos.py's soak, bench/scale.py, bench/pass_cost.py): every process of the product on a stack of its
own under a folder (an embedded PostgreSQL and Redis on free ports, a throwaway control-plane key and secret), each
restartable after a SIGKILL. `local_env` (bench/pipeline.py, bench/page_load.py): the environment for a bench that uses
this machine's PostgreSQL and Redis under a database of its own, with a throwaway control-plane key, so no bench needs
a key set by hand. A bench script imports this module by name: a script's own folder is on its import path.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from local_children import Child, session_nice_of  # noqa: E402
from local_services import EmbeddedPostgres, EmbeddedRedis, control_key_file, wait_for  # noqa: E402
from local_stack import SCHEDULER_NICE  # noqa: E402

from contracts.broker import without_credentials  # noqa: E402

PY = sys.executable
DATABASES = ("redis", "postgres")
# A folder holding a stopped, migrated PostgreSQL data folder (`postgres/`) and its `postgres-password`, as a Stack
# leaves them under its own (`python bench/stack.py pgdata FOLDER` makes one): a new Stack starts from a copy of it
# instead of initdb and every migration from nothing. The suite makes one per session (tests/bench/conftest.py); unset,
# as from a fresh shell, each stack initialises its own. migrate still runs on the copy: a no-op when the copy was made
# from this checkout's migrations, it applies any newer ones.
PGDATA_TEMPLATE = "TFDASH_BENCH_PGDATA"
AGENT_HEARTBEAT_S = 1.0
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def local_env(database: str, redis_db: int, **extra: str) -> dict[str, str]:
    """Point this process (and what it starts) at this machine's PostgreSQL (database `database`, or the one named by
    TFDASH_BENCH_DATABASE, as the suite does) and Redis (`redis_db`), with a throwaway control-plane key and secret.
    TFDASH_BENCH_POSTGRES and TFDASH_BENCH_REDIS name other servers (a URL without its database: the suite passes
    its own, which are embedded ones on a machine with neither running). Returns the environment, also set in
    os.environ."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from contracts.signing import private_key_text

    database = os.environ.get("TFDASH_BENCH_DATABASE") or database
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=f"{os.environ.get('TFDASH_BENCH_POSTGRES') or 'postgres://postgres@127.0.0.1:5432'}/{database}",
        REDIS_URL=f"{os.environ.get('TFDASH_BENCH_REDIS') or 'redis://127.0.0.1:6379'}/{redis_db}",
        DEBUG="0",
        SECRET_KEY="bench-only",
        LOG_LEVEL="WARNING",
        # The settings have no built-in key: the bench and the servers it starts share a throwaway one.
        TFDASH_CONTROL_KEY=private_key_text(Ed25519PrivateKey.generate()),
        **extra,
    )
    os.environ.pop("TFDASH_CONTROL_KEY_FILE", None)
    return dict(os.environ)


def prepare_database(*, collectstatic: bool = False) -> None:
    """A fresh database for `local_env`'s DATABASE_URL, migrated; its Redis database emptied."""
    import psycopg
    import redis

    server, name = os.environ["DATABASE_URL"].rsplit("/", 1)
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    subprocess.run([PY, "manage.py", "migrate", "-v", "0"], cwd=ROOT, check=True)
    if collectstatic:
        subprocess.run([PY, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, check=True)
    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()


def start(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    """A server of the bench's, its output in /tmp/bench-<name>.log, in a session of its own (killed as a group)."""
    log = open(f"/tmp/bench-{name}.log", "wb")  # noqa: SIM115 - held open for the process's life
    return subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def wait_line(path: str, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in Path(path).read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise SystemExit(f"{path} never said {text!r}")


# --- the stack -------------------------------------------------------------------------------------------------------
class Stack:
    """Every process of the product, each restartable after a SIGKILL."""

    def __init__(
        self,
        var: Path,
        *,
        scheduler_apart: bool = True,
        scheduler_nice: int | None = SCHEDULER_NICE,
        planes: int = 1,
        plane_netns: list[str] | None = None,
        bind: str = "127.0.0.1",
    ) -> None:
        self.var = var
        # Control planes: 1, or 2 (a second set of every control-plane process, named NAME@b, as on a second machine:
        # its own node names, web port, beat schedule file and ingest consumer; docs/operations/two-control-planes.md).
        if planes not in (1, 2):
            raise ValueError("a stack runs one or two control planes")
        self.planes = planes
        # Each plane's network namespace (`ip netns exec`, made by the caller: tests/support/netns.py), none by
        # default; then PostgreSQL and Redis listen on `bind` too (the namespaces' bridge address), where they reach.
        self.plane_netns = dict(zip(["", "b"], plane_netns or [], strict=False))
        if self.plane_netns and len(self.plane_netns) != planes:
            raise ValueError("one network namespace per control plane")
        self.bind = bind
        # The scheduler's session at this CPU nice, as `make run` starts it (None: as every other process;
        # bench/scale.py --scheduler-equal).
        self.scheduler_nice = scheduler_nice
        # Scheduler passes in a worker of their own (`scheduler`), as the product ships them (`make run`, compose);
        # False: the orchestrator's worker takes them too (the layout before; bench/scale.py --scheduler-shared).
        self.scheduler_apart = scheduler_apart
        self.logs = var / "log"
        self.logs.mkdir(parents=True)
        template = os.environ.get(PGDATA_TEMPLATE)
        if template and not (var / "postgres").exists():
            shutil.copy2(Path(template) / "postgres-password", var / "postgres-password")
            # -a: the owner too (as root the data folder is the server's user's, which it requires).
            subprocess.run(["cp", "-a", str(Path(template) / "postgres"), str(var / "postgres")], check=True)
        self.pg = EmbeddedPostgres(var, port=free_port())
        self.redis = EmbeddedRedis(var / "redis", free_port(), password_file=var / "redis-password", bind=bind)
        self.web_port = free_port()
        self.web_ports = {"": self.web_port, "b": free_port()}
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PYTHONUNBUFFERED": "1",
            "TFDASH_VAR_DIR": str(var),
            "DATABASE_URL": self.pg.url.replace("@127.0.0.1:", f"@{bind}:"),
            "REDIS_URL": self.redis.url("0"),
            "LOG_LEVEL": "INFO",
            # The settings have no built-in key: the soak's stack gets a throwaway one.
            "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(32),
            "DEBUG": os.environ.get("DEBUG", "1"),
            "TFDASH_CONTROL_KEY_FILE": str(control_key_file(var / "control-key")),
        }
        self.children: dict[str, Child] = {}
        self.agents: dict[str, dict[str, str]] = {}  # host -> {"token", "port_range"}
        self.control_key = ""  # the public key every agent pins
        self.lock = threading.Lock()
        # Every child is started from this one thread, which lives as long as the stack: a child is tethered to the
        # thread that started it (scripts/tether.py: the kernel's parent-death signal follows the parent thread), so
        # one restarted from a thread that then ended (the chaos monkey's) was stopped with it.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stack-spawner")

    def control_plane(self, plane: str | None = None) -> list[str]:
        """The product's own processes besides the databases and agents, in the order to start them: every plane's,
        or plane `plane`'s ("": the first, "b": the second)."""
        names = ["web", "orchestrator", *(["scheduler"] if self.scheduler_apart else []), "webhooks", "ingest"]
        planes = ["", "b"][: self.planes] if plane is None else [plane]
        return [f"{name}@{p}" if p else name for p in planes for name in names]

    def kill_plane(self, plane: str) -> list[str]:
        """SIGKILL every process of one control plane at once (each one's whole process group), as a machine that
        lost its power would; returns their names."""
        with self.lock:
            children = {name: self.children[name] for name in self.control_plane(plane)}
        for child in children.values():
            child.signal(signal.SIGKILL)
        for child in children.values():
            child.proc.wait()
            child.log.close()
        return list(children)

    def start(self, name: str) -> None:
        argv, env, options = self._command(name)
        netns = self.plane_netns.get(name.partition("@")[2]) if name in self.control_plane() else None
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]  # execs argv in the namespace: same pid, same group
        child = self._spawner.submit(Child, name, argv, env, self.logs, **options).result()
        with self.lock:
            self.children[name] = child

    def _command(self, full_name: str) -> tuple[list[str], dict[str, str], dict[str, Any]]:
        name, _, plane = full_name.partition("@")  # NAME@b: the second control plane's
        node = f"-{plane}" if plane else ""
        if name == "postgres":
            argv = self.pg.argv()
            if self.bind != "127.0.0.1":  # loopback and the bridge (pg_hba: start_databases)
                argv[argv.index("-h") + 1] = f"127.0.0.1,{self.bind}"
            return argv, self.env, self.pg.popen_options()
        if name == "redis":
            return self.redis.argv(), self.env, {}
        if name == "web":
            return (
                [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_ports[plane]), "config.asgi:application"],
                self.env,
                {},
            )
        if name == "orchestrator":
            queues = "orchestrator" if self.scheduler_apart else "orchestrator,scheduler"
            return (
                [PY, "-m", "celery", "-A", "config", "worker", "-Q", queues, "-B", "--pool", "threads", "-c",
                 "4", "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO",
                 "--hostname", f"orchestrator{node}@%h", "-s", str(self.var / f"celerybeat-schedule{node}")],
                self.env,
                {},
            )  # fmt: skip
        if name == "scheduler":  # the scheduler's own worker (scheduler_apart): one pass at a time, as shipped
            return (
                [PY, "-m", "celery", "-A", "config", "worker", "-Q", "scheduler", "--pool", "threads", "-c", "1",
                 "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO",
                 "--hostname", f"scheduler{node}@%h"],
                self.env,
                {"nice": self.scheduler_nice},
            )  # fmt: skip
        if name == "webhooks":  # webhook deliveries in a worker of their own, as shipped
            return (
                [PY, "-m", "celery", "-A", "config", "worker", "-Q", "webhooks", "--pool", "threads", "-c", "1",
                 "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO",
                 "--hostname", f"webhooks{node}@%h"],
                self.env,
                {},
            )  # fmt: skip
        if name == "ingest" or name.startswith("ingest-"):  # ingest-P: partition P of TFDASH_INGEST_PARTITIONS
            partition = name.removeprefix("ingest").removeprefix("-") or "0"
            # Each plane's reader of a partition is a consumer of its own name in the one group.
            consumer = ["--consumer", f"ingest-{partition}{node}"] if plane else []
            return [PY, "manage.py", "ingest_metrics", "--partition", partition, *consumer], self.env, {}
        host = name.removeprefix("agent-")
        agent = self.agents[host]
        env = {**self.env, "TFDASH_AGENT_TOKEN": agent["token"]}
        for secret in ("DATABASE_URL", "TFDASH_CONTROL_KEY_FILE"):  # an agent needs none of the control plane's secrets
            env.pop(secret, None)
        return (
            [PY, "-m", "worker_agent", "--server", without_credentials(self.env["REDIS_URL"]), "--host", host,
             "--control-key", self.control_key, "--port-range",
             agent["port_range"], "--heartbeat-interval", str(AGENT_HEARTBEAT_S), "--workdir",
             str(self.var / "agents" / host), "--shared-root", str(self.var / "shared")],
            env,
            {},
        )  # fmt: skip

    def session_nice(self, name: str) -> int | None:
        """The CPU nice of the session the service runs in, as the kernel reports it (None: no autogroups)."""
        with self.lock:
            return session_nice_of(self.children[name].proc.pid)

    def kill(self, name: str) -> None:
        """SIGKILL the service's whole process group (an agent's task processes have sessions of their own)."""
        with self.lock:
            child = self.children[name]
        child.signal(signal.SIGKILL)
        child.proc.wait()
        child.log.close()

    def alive(self, name: str) -> bool:
        with self.lock:
            return self.children[name].proc.poll() is None

    def stop_all(self) -> None:
        """The product first (agents kill their tasks and report it), then the servers it was talking to.
        PostgreSQL gets SIGINT, its fast shutdown (`pg_ctl stop -m fast`): SIGTERM is its smart one, which waits for
        every client to leave, and this process's own connection (set_up_django) never did: each stop waited out the
        guard's GRACE_S (10 s) for a SIGKILL."""
        with self.lock:
            children = dict(self.children)
        for group in ([c for n, c in children.items() if n not in DATABASES], [children[n] for n in DATABASES]):
            for child in group:
                child.signal(signal.SIGINT if child is children.get("postgres") else signal.SIGTERM)
            deadline = time.monotonic() + 20
            for child in group:
                child.stop(deadline)
        self._spawner.shutdown(wait=False)

    def set_up_django(self, *also: str) -> None:
        """Start the databases, then set this process's Django up on them (the stack's database, Redis, settings and
        keys in os.environ, and its variables `also`) and migrate."""
        self.start_databases()
        shared = ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "TFDASH_CONTROL_KEY_FILE", "SECRET_KEY", *also)
        os.environ.update({key: self.env[key] for key in shared})
        os.environ["LOG_LEVEL"] = "WARNING"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", "--noinput", verbosity=0, stdout=io.StringIO())

    def start_local_cluster(self, hosts: int, first_port: int) -> None:
        """Register a local cluster of `hosts` hosts (`manage.py local_cluster`, their TF ports from `first_port`, the
        shared folder var/shared), keep its control key and each agent's token and port range, and start the control
        plane and the agents. Needs `set_up_django` first."""
        from django.core.management import call_command

        out = io.StringIO()
        call_command("local_cluster", hosts=hosts, first_port=first_port, shared_dir=str(self.var / "shared"),
                     stdout=out)  # fmt: skip
        cluster = json.loads(out.getvalue())
        self.control_key = cluster["control_key"]
        for host in cluster["hosts"]:
            self.agents[host["host"]] = {"token": host["token"], "port_range": host["port_range"]}
        for name in [*self.control_plane(), *(f"agent-{h}" for h in self.agents)]:
            self.start(name)

    def start_databases(self) -> None:
        self.pg.prepare()
        hba = self.pg.data / "pg_hba.conf"
        line = f"host all all {ipaddress.ip_network(f'{self.bind}/24', strict=False)} scram-sha-256\n"
        if self.bind != "127.0.0.1" and line not in hba.read_text():  # the namespaces' /24, by password
            with hba.open("a") as out:
                out.write(line)
        self.start("postgres")
        wait_for(self.pg.answers, 60, "PostgreSQL", self.logs / "postgres.log")
        self.pg.ensure_database()
        self.start("redis")
        wait_for(self._redis_answers, 30, "Redis", self.logs / "redis.log")

    def _redis_answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.env["REDIS_URL"], socket_connect_timeout=1).ping())
        except redis.RedisError:
            return False


def with_retry(what: str, action: Callable[[], T], timeout_s: float = 120) -> T:
    """Run a database action, waiting out PostgreSQL restarts (the monkey kills it too)."""
    from django.db import InterfaceError, OperationalError, close_old_connections

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return action()
        except (OperationalError, InterfaceError):
            if time.monotonic() > deadline:
                raise
            close_old_connections()
            time.sleep(0.5)


@contextlib.contextmanager
def django_in_process(prefix: str) -> Iterator[None]:
    """Embedded PostgreSQL and Redis under a temporary folder named from `prefix`, this process's Django set up on them
    and migrated (the in-process benches: pass_cost, event_cost); everything stopped and removed on the way out."""
    var = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(var, 0o755)  # noqa: S103 - the embedded PostgreSQL runs as its own user when we are root
    stack = Stack(var)
    try:
        stack.set_up_django()
        yield
    finally:
        stack.stop_all()
        shutil.rmtree(var, ignore_errors=True)


def make_pgdata_template(folder: Path) -> None:
    """A stopped, migrated PostgreSQL data folder under `folder` (a new folder), for PGDATA_TEMPLATE."""
    stack = Stack(folder)
    try:
        stack.set_up_django()
    finally:
        stack.stop_all()


if __name__ == "__main__":
    # python bench/stack.py pgdata FOLDER
    if sys.argv[1:2] != ["pgdata"] or len(sys.argv) != 3:
        raise SystemExit("usage: python bench/stack.py pgdata FOLDER")
    os.environ.pop(PGDATA_TEMPLATE, None)
    make_pgdata_template(Path(sys.argv[2]))
