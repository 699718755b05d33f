"""Hosts with their own addresses (tests/support/netns.py): a control plane in the root namespace, bound to the
bridge's address, and an agent in each namespace, registered through the REST API with its namespace's address and
put in service with the commands that registration returns: `tfdash-agent join URL ...` (over the bridge, to the web
server) and `tfdash-agent run`, from a virtualenv with only `pip install ./agent` in it (tests/agent_dist/conftest.py:
no Django, no TensorFlow). Its tasks run in the cluster's default task environment `main`, the product's virtualenv,
whose TensorFlow each agent probes, as `make run` sets it up.

The control plane is this folder's own (web, orchestrator + beat, scheduler, ingest, a Redis with ACLs and the object
store, every one listening on the bridge's address) against the suite's second test database, `isolated`
(tests/settings.py): the session's control plane listens on loopback, which a namespace cannot reach, and schedules
every job of the "default" database. One per module (starting it costs tens of seconds); hosts and agents are a
test's own (a transactional test empties the tables when it ends, hosts included).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings
from django.contrib.auth import get_user_model

from orchestrator.identity import api_tokens
from orchestrator.models import Cluster, Host, HostStatus, TaskEnvironment
from scripts.celery_workers import worker_argv
from tests.agent_dist.conftest import agent_env, agent_venv  # noqa: F401 - agent_venv: a fixture used here
from tests.conftest import _artifacts as test_artifacts
from tests.support import probe_cache as probes
from tests.support.databases import database_url
from tests.support.netns import NetnsHost, Network, unavailable_reason
from tests.support.object_store import ObjectStore, running_store
from tests.support.ports import free_port
from tests.support.processes import ManagedProcess, wait_until
from tests.support.redis_server import RedisServer
from tests.support.task_uids import TASK_UIDS  # root only here, as in CI: each job's tasks under a uid of its own

DB = "isolated"  # tests/settings.py: a test database of its own, made only in sessions with a test asking for it
HOSTS = 4  # enough for a ParameterServer job's four tasks on four machines, or a two-worker gang and a spare
TF_PORTS = (23000, 23009)  # the same range on every host: each has its own address and its own ports
AGENT_HEARTBEAT_S = 0.5


@dataclass
class ControlPlane:
    """The product's control-plane processes, on the bridge's address, and the clients a test uses to reach them."""

    network: Network
    redis: RedisServer
    store: ObjectStore
    env: dict[str, str]
    workdir: Path
    artifacts: Path
    web_url: str = ""
    procs: dict[str, ManagedProcess] = field(default_factory=dict)

    def start(self) -> None:
        py = sys.executable
        port = free_port(self.network.gateway)
        self.web_url = f"http://{self.network.gateway}:{port}"
        self.procs["orchestrator"] = ManagedProcess(
            "orchestrator",
            worker_argv("orchestrator", 4, "orchestrator-netns@%h", beat_schedule=self.workdir / "beat-schedule"),
            self.env,
        )
        self.procs["scheduler"] = ManagedProcess(
            "scheduler", worker_argv("scheduler", 1, "scheduler-netns@%h"), self.env
        )
        self.procs["ingest"] = ManagedProcess("ingest", [py, "manage.py", "ingest_metrics"], self.env)
        self.procs["web"] = ManagedProcess(
            "web", [py, "-m", "daphne", "-b", self.network.gateway, "-p", str(port), "config.asgi:application"],
            self.env,
        )  # fmt: skip
        self.procs["orchestrator"].wait_for_line(r"orchestrator-netns@\S+ ready", timeout=120)
        self.procs["scheduler"].wait_for_line(r"scheduler-netns@\S+ ready", timeout=120)
        self.procs["ingest"].wait_for_line(r"metrics ingest \S+ ready", timeout=120)
        wait_until(self._web_answers, timeout=120, interval=0.2, what="the web server to answer")

    def _web_answers(self) -> bool:
        web = self.procs["web"]
        if web.proc.poll() is not None:
            raise AssertionError(f"daphne exited ({web.proc.returncode}):\n{web.output()[-4000:]}")
        try:
            requests.get(f"{self.web_url}/api/", timeout=2)
        except requests.RequestException:
            return False
        return True

    def api(self, token: str) -> requests.Session:
        """The REST API as the holder of `token`, over the bridge, as a person's browser or script would reach it."""
        session = requests.Session()
        session.headers["Authorization"] = f"Token {token}"
        return session

    def said(self, pattern: str = "") -> str:
        """The control plane's log lines (those matching `pattern`), for a failure's message."""
        import re

        lines = [f"{n}: {line}" for n, p in self.procs.items() for line in p.output().splitlines()]
        return "\n".join(line for line in lines if re.search(pattern, line, re.I))[-6000:]

    def stop(self) -> None:
        for name, proc in self.procs.items():
            proc.stop()
            (self.artifacts / f"netns-{name}.log").write_text(proc.output())


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with Network(HOSTS) as net:
        yield net


@pytest.fixture(scope="module")
def control_plane(
    network: Network, django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    workdir = tmp_path_factory.mktemp("netns-control-plane")
    # Networked, ACLs kept: `default` off, the control plane as its user, each agent as its host's (broker.py).
    redis = RedisServer(workdir, bind=network.gateway)
    redis.start()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url(DB),
        "REDIS_URL": redis.url,
        "ALLOWED_HOSTS": network.gateway,
        "TFDASH_HEARTBEAT_TIMEOUT_S": str(settings.TFDASH_HEARTBEAT_TIMEOUT_S),
        "TFDASH_WATCHDOG_INTERVAL_S": str(settings.TFDASH_WATCHDOG_INTERVAL_S),
        "TFDASH_ORDER_RESEND_S": str(settings.TFDASH_ORDER_RESEND_S),
        "TFDASH_SCHEDULE_INTERVAL_S": str(settings.TFDASH_SCHEDULE_INTERVAL_S),
        # What `tfdash-agent join` writes into each agent's configuration: a heartbeat every half second, so a lost
        # host is noticed in seconds, and (root here, as in CI) each job's tasks under a uid of their own.
        "TFDASH_AGENT_HEARTBEAT_S": str(AGENT_HEARTBEAT_S),
        "TFDASH_AGENT_TASK_UIDS": TASK_UIDS,
        "PYTHONUNBUFFERED": "1",
    }
    with running_store(network.gateway) as store:
        plane = ControlPlane(network, redis, store, env, workdir, test_artifacts())
        try:
            plane.start()
            yield plane
        finally:
            plane.stop()
            redis.kill()


def agent_argvs(
    commands: dict[str, str], venv: Path, token_file: Path, config: Path, workdir: Path
) -> tuple[list[str], list[str]]:
    """How a host's agent is put in service: the `join` and `run` lines registration returned (POST
    /api/clusters/<id>/hosts/ `agent_commands`, orchestrator/identity/tokens.py), word for word, but for what differs
    between these hosts on one filesystem: `tfdash-agent` is the installed virtualenv's, and each host has its own
    token file, configuration file and work folder (a real host has its own /etc/tfdash-agent)."""
    join = shlex.split(commands["join"])
    run = shlex.split(commands["run"])
    assert join[:2] == ["tfdash-agent", "join"] and run[:2] == ["tfdash-agent", "run"], commands
    join[join.index("--token-file") + 1] = str(token_file)
    program = str(venv / "bin" / "tfdash-agent")
    join_argv = [program, *join[1:], "--config", str(config), "--workdir", str(workdir)]
    return join_argv, [program, *run[1:], "--config", str(config)]


@dataclass
class NetnsCluster:
    """A test's cluster: its hosts (name -> the namespace host it runs on), their agents, the users' API sessions."""

    plane: ControlPlane
    cluster_id: int
    admin: requests.Session
    user: requests.Session
    hosts: dict[str, NetnsHost] = field(default_factory=dict)
    agents: dict[str, ManagedProcess] = field(default_factory=dict)

    def host_of(self, name: str) -> NetnsHost:
        return self.hosts[name]

    def agent_said(self, pattern: str = "") -> str:
        import re

        lines = [f"{n}: {line}" for n, p in self.agents.items() for line in p.output().splitlines()]
        return "\n".join(line for line in lines if re.search(pattern, line, re.I))[-6000:]


@pytest.fixture
def netns_cluster(
    control_plane: ControlPlane,
    network: Network,
    agent_venv: Path,  # noqa: F811 - the fixture imported above
    artifacts_dir: Path,
    probe_cache: Path,
) -> Iterator[Callable[[int], NetnsCluster]]:
    """`make(n)`: a cluster with the object store and no shared folder (hosts share no disk) and its default task
    environment `main`, n hosts of one CPU slot each registered through the API at their namespaces' addresses, an
    agent in each namespace joined and run with the commands the API returned, all online with `main` probed (by the
    first cluster's agents; later ones start with their probes, as tests/conftest.py's start_agent does)."""
    made: list[NetnsCluster] = []
    folders: list[Path] = []

    def make(n: int) -> NetnsCluster:
        assert n <= len(network.hosts)
        users = get_user_model().objects.db_manager(DB)
        staff = users.create_user("staff", password="pw-staff-123", is_staff=True)
        alice = users.create_user("alice", password="pw-alice-123")
        admin = control_plane.api(api_tokens.issue(staff, using=DB)[0])
        cluster = NetnsCluster(control_plane, 0, admin, control_plane.api(api_tokens.issue(alice, using=DB)[0]))
        made.append(cluster)
        answer = admin.post(f"{control_plane.web_url}/api/clusters/", json={"name": "netns-lab"}, timeout=30)
        assert answer.status_code == 201, answer.text
        cluster.cluster_id = answer.json()["id"]
        store = control_plane.store
        Cluster.objects.using(DB).filter(pk=cluster.cluster_id).update(
            store_endpoint=store.endpoint, store_bucket=store.bucket, store_region="us-east-1", store_path_style=True,
            store_credentials_file=str(store.credentials_file),
        )  # fmt: skip
        TaskEnvironment.objects.using(DB).create(
            cluster_id=cluster.cluster_id,
            name="main",
            interpreter=str(Path(sys.executable).absolute()),
            is_default=True,
        )
        for host in network.hosts[:n]:
            name = f"n{host.index}"
            answer = admin.post(
                f"{control_plane.web_url}/api/clusters/{cluster.cluster_id}/hosts/",
                json={"name": name, "address": host.address, "port_min": TF_PORTS[0], "port_max": TF_PORTS[1],
                      "cpu_slots": 1},
                timeout=30,
            )  # fmt: skip
            assert answer.status_code == 201, answer.text
            body = answer.json()
            cluster.hosts[name] = host
            cluster.agents[name] = _start_agent(network, host, name, body, agent_venv, folders, probe_cache)
        try:
            wait_until(lambda: _ready(n), 240, interval=0.5, what=f"{n} hosts online with environment main probed")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{cluster.agent_said()}") from None
        return cluster

    yield make
    probes.keep(probe_cache, [_workdir(folder) for folder in folders])
    # SIGTERM first, to every agent at once (one without its cable waits seconds for its broker): each kills its TF
    # processes and reports it; then whatever is left in the namespace.
    agents = [(name, proc) for cluster in made for name, proc in cluster.agents.items()]
    running = [proc for _name, proc in agents if proc.proc.poll() is None]
    for proc in running:
        proc.ask_to_stop()
    for proc in running:
        with contextlib.suppress(Exception):  # killed instead; the namespace is emptied below in any case
            proc.wait_stopped(timeout=20)
    for name, proc in agents:
        proc.stop()
        (artifacts_dir / f"netns-agent-{name}.log").write_text(proc.output())
    for host in network.hosts:
        network.mend(host)
        network.kill_all_in(host)
    _let_the_control_plane_take_the_last_messages(control_plane)
    import shutil

    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _ready(n: int) -> bool:
    hosts = Host.objects.using(DB).filter(status=HostStatus.ONLINE)
    return len([h for h in hosts if any(e["name"] == "main" and e["ok"] for e in h.environments)]) == n


def _workdir(folder: Path) -> Path:
    """The workdir of the netns agent whose files are in `folder` (its token, its joined config)."""
    return folder / "work"


def _start_agent(
    network: Network,
    host: NetnsHost,
    name: str,
    registered: dict[str, Any],
    venv: Path,
    folders: list[Path],
    probe_cache: Path,
) -> ManagedProcess:
    """The agent of `name` in `host`'s namespace, as an operator puts it in service there: the token in a 0600 file,
    `join` (which asks the control plane, over the bridge, for the host's configuration and writes it), then `run`.
    Its environment has none of the control plane's settings (database, Redis password, signing key)."""
    folder = Path(tempfile.mkdtemp(prefix=f"tfdash-netns-{name}-"))
    folder.chmod(0o755)  # task uids enter its work folder
    folders.append(folder)
    token_file = folder / "token"
    token_file.touch(mode=0o600)
    token_file.write_text(registered["agent_token"])
    join, run = agent_argvs(registered["agent_commands"], venv, token_file, folder / "config.json", _workdir(folder))
    probes.seed(_workdir(folder), probe_cache)
    joined = subprocess.run(host.command(join), env=agent_env(), capture_output=True, text=True, timeout=120)
    assert joined.returncode == 0, f"{name}: {shlex.join(join)}\n{joined.stdout}{joined.stderr}"
    return network.start(host, f"agent-{name}", run, agent_env(), cwd=folder)


def _let_the_control_plane_take_the_last_messages(plane: ControlPlane) -> None:
    """Let the orchestrator and ingest store what the agents last sent before the test's tables are emptied."""
    import redis

    from contracts.protocol import ORCHESTRATOR_QUEUE, SCHEDULER_QUEUE

    queues = redis.Redis.from_url(plane.redis.url)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (queues.llen(ORCHESTRATOR_QUEUE) or queues.llen(SCHEDULER_QUEUE)):
        time.sleep(0.1)


def tasks_of(cluster: NetnsCluster, job_id: int, attempt: str = "") -> list[dict[str, Any]]:
    """GET /api/jobs/<id>/tasks/ (the current attempt, or `attempt`) as the job's owner."""
    query = f"?attempt={attempt}" if attempt else ""
    answer = cluster.user.get(f"{cluster.plane.web_url}/api/jobs/{job_id}/tasks/{query}", timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return body["results"] if isinstance(body, dict) else body
