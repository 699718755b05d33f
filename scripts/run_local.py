#!/usr/bin/env python
"""`make run`: the whole product on this machine, one command, Ctrl-C stops it all.

Starts (or reuses) PostgreSQL and Redis (scripts/local_services.py), migrates, makes sure an admin exists, registers
a local cluster of agents, then starts the web server, the orchestrator (Celery worker + beat), the metrics ingest and
one agent per local host, each in a session of its own. Their output goes to var/log/<name>.log; this script prints
only what a person needs.

None of them outlives this script, SIGKILL included: each is started through scripts/tether.py (the kernel's
parent-death signal; a guard that stays to take along what a process with children of its own leaves, an agent's TF
processes included). And one var/ folder has one `make run` at a time: a second one refuses at once, naming the pid
that holds it (scripts/var_lock.py). `--exit-with-parent` (what `make run` passes) stops it when its parent (make)
dies.

A child that exits is started again after a pause (`Backoff`: 1 s, doubling to 30 s while it keeps failing, 1 s again
once it ran a minute), and the line says so; one crash never stops the rest. Ctrl-C or SIGTERM stops everything.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(1, str(ROOT))

import tether  # noqa: E402 - after the path
import var_lock  # noqa: E402 - after the path
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
GRACE_S = 10.0  # from SIGTERM to SIGKILL, on Ctrl-C and in a guard whose `make run` died
# A guard SIGKILLs what is left GRACE_S after SIGTERM; this script SIGKILLs a guard (its last resort) this much later.
GUARD_MARGIN_S = 5.0
TETHER = ROOT / "scripts" / "tether.py"
# The scheduler's session runs at this CPU nice where allowed (session_nice): a pass is one thread the whole fleet
# waits on, using a few percent of a core between passes, and on a machine the rest of the control plane fills it
# waited for a core a third of its time (README, Sizing).
SCHEDULER_NICE = -10


class Backoff:
    """The pause before a child that exited is started again: `first_s`, doubling up to `most_s` while it keeps
    exiting, and `first_s` again once it had run `stable_s` (a crash after an hour is not a crash loop)."""

    def __init__(self, first_s: float = 1.0, most_s: float = 30.0, stable_s: float = 60.0) -> None:
        self.first_s, self.most_s, self.stable_s = first_s, most_s, stable_s
        self._next = first_s

    def after_exit(self, ran_s: float) -> float:
        """The pause before the next start of a child that ran `ran_s` before it exited."""
        if ran_s >= self.stable_s:
            self._next = self.first_s
        pause, self._next = self._next, min(self._next * 2, self.most_s)
        return pause


def tethered(argv: list[str], name: str, *, childless: bool, hold_fd: int | None = None) -> list[str]:
    """`argv` started through scripts/tether.py, so that it ends when this process does, SIGKILL included.

    `childless`: a program that starts no process of its own is exec'ed in place (SIGKILL when this process dies).
    Any other gets a guard that stays its parent: SIGTERM, then SIGKILL after GRACE_S to everything below it, however
    it got there (an agent's TF processes run in sessions of their own and ignore SIGTERM; celery -B forks beat;
    PostgreSQL its backends). `hold_fd`: the var/ lock, kept by a guard until its processes are gone.

    Start it from a thread that lives as long as this process (here: the main thread): the kernel sends the
    parent-death signal when the thread that forked the child ends, not only the process."""
    if sys.platform != "linux":  # prctl is Linux's: elsewhere, started as before, without that guarantee
        return argv
    line = [PY, "-I", str(TETHER), "--parent", str(os.getpid()), "--name", name]
    if not childless:
        line += ["--guard", "--grace", f"{GRACE_S:g}"]
        if hold_fd is not None:
            line += ["--hold-fd", str(hold_fd)]
    return [*line, "--", *argv]


class Child:
    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], log_dir: Path, *, nice: int | None = None,
        childless: bool = False, stops_last: bool = False, hold_fd: int | None = None, **options: Any,
    ) -> None:  # fmt: skip
        self.name = name
        self.argv, self.env, self.options = argv, env, options
        self.nice = nice  # its session's CPU nice (session_nice), when given
        self.childless, self.hold_fd = childless, hold_fd  # how it is tethered to this process (tethered())
        self.stops_last = stops_last  # a server the others talk to (Children.stop_all)
        self.log_path = log_dir / f"{name}.log"
        self.log: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115 - the child writes to it until stop()
        self.backoff = Backoff()
        self.restart_at: float | None = None  # set while it waits to be started again
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.started_at = time.monotonic()
        # Own session: Ctrl-C in the terminal reaches only this script, which then stops children in order.
        # Tethered: it cannot outlive this script, and an exec wrapper arms that, not a preexec_fn.
        argv = tethered(self.argv, self.name, childless=self.childless, hold_fd=self.hold_fd)
        guarded = not self.childless and argv is not self.argv  # (not tethered at all where there is no prctl)
        pass_fds = (self.hold_fd,) if self.hold_fd is not None and guarded else ()
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            pass_fds=pass_fds, **self.options,
        )  # fmt: skip
        if self.nice is not None:
            session_nice(proc.pid, self.nice)
        return proc

    def restart(self) -> None:
        """Start it again, once whatever its last run left in its process group (a beat child) is gone."""
        self.signal(signal.SIGKILL)
        self.proc = self._spawn()

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, deadline: float) -> None:
        """Wait for it to end after SIGTERM until `deadline`, then SIGKILL its group. A guard SIGKILLs what is below
        it GRACE_S after SIGTERM by itself: the deadline leaves it GUARD_MARGIN_S for that (stop_all)."""
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        # Whatever else is left in its group (a TF process under an agent, a beat child) goes too.
        self.signal(signal.SIGKILL)
        self.log.close()


def session_nice(pid: int, nice: int) -> None:
    """Set the CPU nice of the session `pid` leads, where this kernel and this user can (`session_nice_of` says what
    the kernel made of it).

    Every child leads a session of its own, and with autogroups on (`kernel.sched_autogroup_enabled`, the default of
    many distribution kernels) Linux shares the CPU between sessions first: a process's own nice counts only inside
    its session, so `nice`/`renice` on the scheduler did nothing against the rest of the control plane (README,
    Sizing). The session's nice is what weighs (`/proc/PID/autogroup`; below 0 needs root or CAP_SYS_NICE)."""
    # No autogroups (then a process's nice is what counts), or not allowed: equal shares.
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def session_nice_of(pid: int) -> int | None:
    """The CPU nice of the session `pid` is in (None: no autogroups on this kernel)."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])  # "/autogroup-123 nice -10"
    except (OSError, IndexError, ValueError):
        return None


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
        "uid of its own (README, Security)."
    )


class Children:
    """The processes `make run` started: one that exits is started again after its backoff (and that is said), all
    of them are stopped at the end."""

    def __init__(self, log_dir: Path, say: Callable[[str], None], hold_fd: int | None = None) -> None:
        self.log_dir = log_dir
        self.say = say
        self.hold_fd = hold_fd  # the var/ lock, which every guard keeps too (tethered())
        self.all: list[Child] = []
        self.stopping = False

    def start(self, name: str, argv: list[str], env: dict[str, str], **options: Any) -> Child:
        child = Child(name, argv, env, self.log_dir, hold_fd=self.hold_fd, **options)
        self.all.append(child)
        return child

    def tend(self, now: float | None = None) -> None:
        """One look at every child: one that exited is given its restart time, one whose time came is started."""
        now = time.monotonic() if now is None else now
        for child in self.all:
            if self.stopping:
                return
            if child.restart_at is None:
                code = child.proc.poll()
                if code is None:
                    continue
                pause = child.backoff.after_exit(now - child.started_at)
                child.restart_at = now + pause
                self.say(f"{child.name} exited with code {code}; restarting in {pause:g} s (log: {child.log_path})")
            elif now >= child.restart_at:
                child.restart_at = None
                child.restart()
                self.say(f"{child.name} restarted (pid {child.proc.pid})")

    def stop_all(self) -> None:
        """The programs first, then the servers they talk to (`stops_last`): an agent stopping kills its tasks and
        reports their exits, which must still find Redis (stopped together, they were lost: "broker unreachable")."""
        self.stopping = True
        for stage in ([c for c in self.all if not c.stops_last], [c for c in self.all if c.stops_last]):
            for child in reversed(stage):
                child.signal(signal.SIGTERM)
            deadline = time.monotonic() + GRACE_S + GUARD_MARGIN_S
            for child in reversed(stage):
                child.stop(deadline)


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
            [PY, "-m", "celery", "-A", "config", "worker", "-Q", "orchestrator", "-B", "--pool", "threads",
             "-c", "4", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-l", "INFO", "--hostname", "orchestrator@%h",
             "-s", str(self.var / "celerybeat-schedule")],
        )  # fmt: skip
        # Scheduler passes in a process of their own: a pass then shares no interpreter lock with the hosts' events
        # (README "Sizing": at fleet size that was the difference between 972 and 1,209 tasks/s placed).
        self.start(
            "scheduler",
            [PY, "-m", "celery", "-A", "config", "worker", "-Q", "scheduler", "--pool", "threads", "-c", "1",
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-l", "INFO", "--hostname", "scheduler@%h"],
            nice=SCHEDULER_NICE, childless=True,  # a thread pool: no process of its own
        )  # fmt: skip
        # Webhook deliveries in a worker of their own: a slow receiver holds none of the orchestrator's threads (one
        # sweep at a time, its POSTs in a bounded pool of their own: orchestrator/webhooks/delivering.py).
        self.start(
            "webhooks",
            [PY, "-m", "celery", "-A", "config", "worker", "-Q", "webhooks", "--pool", "threads", "-c", "1",
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-l", "INFO", "--hostname", "webhooks@%h"],
            childless=True,
        )  # fmt: skip
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


def exit_with_parent() -> None:
    """Stop (SIGTERM: the same orderly stop as Ctrl-C) when the parent dies, `make` SIGKILLed included: `make run`
    passes --exit-with-parent. Not by default: a run started from a shell that then exits (nohup) keeps running.

    The parent is whichever this process has when it gets here (make may be PID 1, in a container): one that died
    during this interpreter's start-up, before that, goes unnoticed, and the run goes on as it did before this."""
    parent = os.getppid()
    if sys.platform == "linux" and not tether.bind_to_parent(parent, signal.SIGTERM):
        raise SystemExit("the process that started this one is gone: not starting")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--exit-with-parent"]):
        print(f"usage: {sys.argv[0]} [--exit-with-parent]", file=sys.stderr)
        return 2

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        if args:
            exit_with_parent()
        stack = Stack()
    except SystemExit as exc:  # nothing started yet: a var/ in use, or a parent already gone
        print(f"[run] {exc.code}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:  # stopped before anything started
        return 1
    code = 0
    try:
        stack.run()
    except KeyboardInterrupt:
        stack.say("Stopping ...")
    except SystemExit as exc:
        stack.say(str(exc.code))
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stack.stop_all()
        stack.say("stopped.")
    return code


if __name__ == "__main__":
    sys.exit(main())
