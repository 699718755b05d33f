"""Redis restarted mid-job, without persistence (as the CI's Redis): the stream, its consumer group, every Celery queue
and kombu's bindings are gone at once. The whole product runs here against a Redis and a database of this test's own
(web, orchestrator, ingest, two agents, MultiWorkerMirrored over gRPC), so the restart touches nothing else: the
session's orchestrator schedules every job it sees in the "default" test database, hence the separate one.

What holds, and is asserted:
- the job finishes (`succeeded`): the orchestrator's consumer, the agents' heartbeats and the ingest come back alone;
- points from before the restart and after it are stored; every point a task reported once Redis was gone (buffered
  by the agent's outbox while Redis was down, sent when it was back) is stored, and so is every later one;
- what is not promised: an entry the agent had already added to the stream but the ingest had not read yet when
  Redis died is gone with it (a few milliseconds of reports at most); only points measured before the kill can be it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import requests
from django.conf import settings
from django.contrib.auth import get_user_model

from contracts import broker
from contracts.broker import without_credentials
from orchestrator.identity import api_tokens
from orchestrator.identity.tokens import issue as issue_token
from orchestrator.models import Cluster, Host, HostStatus, Job, MetricPoint, Task
from tests.support.databases import database_url
from tests.support.ports import free_port
from tests.support.processes import ManagedProcess, wait_until
from tests.support.redis_server import RedisServer
from tests.support.wire import control_key_flags

DB = "isolated"  # tests/settings.py: a test database of its own, made only when a test asks for it
pytestmark = [
    pytest.mark.django_db(transaction=True, databases=[DB]),
]

AGENT_HEARTBEAT_S = 0.5
FIRST_PORT = 30600  # TF gRPC ports of this test's hosts, apart from the other end-to-end tests' ranges
# MultiWorkerMirrored x 2 takes 15-30 ms a step on a busy 2-core machine: epochs of 2-4 s, a few train windows each.
EPOCHS = 10
STEPS_PER_EPOCH = 100
KILL_AFTER_EPOCH = 2
OUTAGE_S = 2.0
# A train point closes its window at the first step that ends MIN_INTERVAL_S (0.5 s) after the window opened, so a
# window spans 0.5 s plus at most one step; with a window's report missing, its successor's steps would span ~1 s.
MAX_WINDOW_S = 0.9


class Deployment:
    """Every service of the product, pointed at the private Redis and database."""

    def __init__(self, env: dict[str, str], redis_url: str, workdir: Path, artifacts: Path) -> None:
        self.env = env
        self.artifacts = artifacts
        self.redis_url = redis_url
        self.workdir = workdir
        self.web_port = free_port()
        self.web_url = f"http://127.0.0.1:{self.web_port}"
        self.label = "redis-restart"  # the prefix of its processes' logs in test-artifacts/
        self.procs: dict[str, ManagedProcess] = {}
        self.previous: list[tuple[str, ManagedProcess]] = []  # processes replaced by `restart`, for their logs

    def start(self, agents: dict[str, str]) -> None:
        py = sys.executable
        self._start_orchestrator()
        self.procs["ingest"] = ManagedProcess("ingest", [py, "manage.py", "ingest_metrics"], self.env)
        self._start_web()
        for host, token in agents.items():
            agent_env = {**os.environ, "TFDASH_AGENT_TOKEN": token, "PYTHONUNBUFFERED": "1"}
            agent_env.pop("DJANGO_SETTINGS_MODULE", None)  # the agent must work without Django
            self.procs[f"agent-{host}"] = ManagedProcess(
                f"agent-{host}",
                [py, "-m", "worker_agent", "--server", without_credentials(self.redis_url), "--host", host,
                 *control_key_flags(), "--heartbeat-interval", str(AGENT_HEARTBEAT_S),
                 "--workdir", str(self.workdir / f"agent-{host}"), "--shared-root", str(self.workdir / "shared")],
                agent_env,
            )  # fmt: skip
        self.procs["orchestrator"].wait_for_line(r"orchestrator-restart@\S+ ready", timeout=60)
        self.procs["ingest"].wait_for_line(r"metrics ingest \S+ ready", timeout=60)
        wait_until(self._web_accepts, timeout=60, interval=0.1, what="the web server to accept connections")

    def _start_orchestrator(self) -> None:
        self.procs["orchestrator"] = ManagedProcess(
            "orchestrator",
            [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "orchestrator,scheduler", "-B",
             "--pool", "threads", "-c", "4", "-l", "INFO", "--hostname", "orchestrator-restart@%h",
             "-s", str(self.workdir / "beat-schedule")],
            self.env,
        )  # fmt: skip

    def _start_web(self) -> None:
        self.procs["web"] = ManagedProcess(
            "web",
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_port), "config.asgi:application"],
            self.env,
        )  # fmt: skip

    def kill(self, name: str) -> None:
        """SIGKILL a service's whole process group, as a crash would."""
        self.previous.append((name, self.procs[name]))
        self.procs[name].kill()

    def start_again(self, name: str) -> None:
        """A fresh process for a killed service (the orchestrator or the web server), waited for until it serves."""
        if name == "orchestrator":
            self._start_orchestrator()
            self.procs[name].wait_for_line(r"orchestrator-restart@\S+ ready", timeout=60)
        else:
            self._start_web()
            wait_until(self._web_accepts, timeout=60, interval=0.1, what="the web server to accept connections")

    def _web_accepts(self) -> bool:
        web = self.procs["web"]
        if web.proc.poll() is not None:
            raise AssertionError(f"daphne exited ({web.proc.returncode}):\n{web.output()[-4000:]}")
        try:
            socket.create_connection(("127.0.0.1", self.web_port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def output(self, name: str) -> str:
        return self.procs[name].output()

    def stop(self) -> None:
        # Agents first, politely: they kill their TF processes (own sessions) and report it.
        for name, proc in self.procs.items():
            if name.startswith("agent-") and proc.proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):  # then it was killed: nothing more to do
                    proc.terminate(timeout=20)
        for name, proc in self.procs.items():
            proc.stop()
            (self.artifacts / f"{self.label}-{name}.log").write_text(proc.output())
        for i, (name, proc) in enumerate(self.previous):
            (self.artifacts / f"{self.label}-{name}-before-restart-{i}.log").write_text(proc.output())


@pytest.fixture
def private_redis(tmp_path: Path, artifacts_dir: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()
    (artifacts_dir / "redis-restart-redis.log").write_text("\n--- restart ---\n".join(server.logs))


@pytest.fixture
def deployment(private_redis: RedisServer, tmp_path: Path, artifacts_dir: Path) -> Iterator[Deployment]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url(DB),
        "REDIS_URL": private_redis.url,
        "TFDASH_HEARTBEAT_TIMEOUT_S": str(settings.TFDASH_HEARTBEAT_TIMEOUT_S),
        "TFDASH_WATCHDOG_INTERVAL_S": str(settings.TFDASH_WATCHDOG_INTERVAL_S),
        "PYTHONUNBUFFERED": "1",
    }
    stack = Deployment(env, private_redis.url, tmp_path, artifacts_dir)
    yield stack
    stack.stop()


@pytest.fixture
def two_hosts(tmp_path: Path) -> dict[str, str]:
    """Two registered hosts of one CPU slot each (so MultiWorkerMirrored puts one worker on each): name -> token."""
    (tmp_path / "shared").mkdir()  # the cluster's shared folder: each agent's --shared-root
    cluster = Cluster.objects.using(DB).create(name="restart-lab", shared_dir=str(tmp_path / "shared"))
    tokens = {}
    for i in range(2):
        low = FIRST_PORT + 10 * i
        host = Host(cluster=cluster, name=f"restart-{i}", address="127.0.0.1", port_min=low, port_max=low + 9,
                    cpu_slots=1)  # fmt: skip
        tokens[host.name] = issue_token(host, using=DB)
    return tokens


@pytest.fixture
def api_token() -> str:
    user = get_user_model().objects.db_manager(DB).create_user("alice", password="pw-alice-123")
    return api_tokens.issue(user, using=DB)[0]


def test_a_job_survives_a_redis_restart_and_every_point_reported_after_it_is_stored(
    private_redis: RedisServer, deployment: Deployment, two_hosts: dict[str, str], api_token: str
) -> None:
    started = time.monotonic()
    deployment.start(two_hosts)
    wait_until(lambda: Host.objects.using(DB).filter(status=HostStatus.ONLINE).count() == 2, 30, what="2 hosts online")
    config = {"epochs": EPOCHS, "steps_per_epoch": STEPS_PER_EPOCH, "per_replica_batch": 32, "checkpoint": False}
    response = requests.post(
        f"{deployment.web_url}/api/jobs/",
        json={"name": "digits through a Redis restart", "strategy": "multi_worker_mirrored", "workers": 2, "ps": 0,
              "devices_per_worker": 1, "builtin": "digits_mlp", "builtin_config": config},
        headers={"Authorization": f"Token {api_token}"},
        timeout=30,
    )  # fmt: skip
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    submitted = time.monotonic()

    # Mid-training: both workers have finished a few epochs, and those points are stored.
    _wait(lambda: _epochs_stored(job_id, KILL_AFTER_EPOCH) == 2, 120, job_id, deployment,
          f"both workers' epoch {KILL_AFTER_EPOCH} stored")  # fmt: skip
    killing = time.monotonic()
    stored_before = set(MetricPoint.objects.using(DB).filter(job_id=job_id).values_list("pk", flat=True))
    private_redis.kill()
    killed_at = time.time()  # every point measured after this was published, if at all, to the new Redis
    time.sleep(OUTAGE_S)  # the outage itself: nothing to wait for
    private_redis.start()
    back_at = time.time()

    job = _wait(lambda: (j := Job.objects.using(DB).get(pk=job_id)).is_terminal and j, 150, job_id, deployment,
                "the job to end")  # fmt: skip
    finished = time.monotonic()
    tasks = list(job.current_tasks())
    assert job.state == "succeeded", (job.reason, _diagnose(job_id, deployment))
    # The other worker ends by itself a little later; its exit event is its last message, after its last point.
    _wait(lambda: all(t.exit_code is not None for t in job.current_tasks()), 60, job_id, deployment,
          "both workers to exit")  # fmt: skip
    queues = redis.Redis.from_url(private_redis.url)
    # The ingest deletes a stream entry only once its rows are committed: an empty stream is a stored one.
    streams = [broker.stream(host.name, broker.METRICS) for host in Host.objects.using(DB).all()]
    _wait(lambda: not any(queues.xlen(s) for s in streams), 30, job_id, deployment, "the metric streams to be drained")
    assert [t.exit_code for t in job.current_tasks()] == [0, 0]

    # The control plane came back: heartbeats of both agents went through the orchestrator again after the restart.
    for host in Host.objects.using(DB).all():
        assert host.status == HostStatus.ONLINE, host
        assert host.last_heartbeat is not None and host.last_heartbeat.timestamp() > back_at, host

    columns = ("pk", "task_id", "phase", "name", "step", "epoch", "value", "ts")
    points = list(MetricPoint.objects.using(DB).filter(job_id=job_id).values(*columns))
    assert stored_before <= {p["pk"] for p in points}
    before = [p for p in points if p["ts"] < killed_at]
    during = [p for p in points if killed_at < p["ts"] < back_at]
    after = [p for p in points if p["ts"] > back_at]
    assert before and during and after, (len(before), len(during), len(after))
    epoch_s = [p["value"] for p in points if p["name"] == "epoch_time_s"]

    assert len(tasks) == 2
    windows_s: list[float] = []
    lost: list[tuple[int, int]] = []
    for task in tasks:
        mine = [p for p in points if p["task_id"] == task.pk]
        ends = {(p["epoch"], p["name"]): p for p in mine if p["phase"] == "epoch_end"}
        # Every epoch has its epoch_end point at its step, with the validation metrics, unless that point was measured
        # before the kill (then the next epoch began before it): the only points a restart may take.
        for epoch in range(1, EPOCHS + 1):
            if (epoch, "loss") not in ends:
                assert epoch < EPOCHS and _began(ends, epoch + 1) < killed_at, (task.label, epoch, sorted(ends))
                lost.append((task.pk, epoch))
                continue
            for name in ("accuracy", "val_loss", "val_accuracy", "epoch_time_s", "learning_rate"):
                assert (epoch, name) in ends, (task.label, epoch, name, sorted(ends))
            assert ends[(epoch, "loss")]["step"] == epoch * STEPS_PER_EPOCH
        windows_s += _assert_train_windows_follow_each_other(task.label, mine, killed_at)
        # Log lines travel the same stream: Keras' "Epoch N/EPOCHS" line of every epoch that began after the kill is
        # stored too.
        began_after = [e for e in range(2, EPOCHS + 1) if (e, "loss") in ends and _began(ends, e) > killed_at]
        wanted = {f"Epoch {e}/{EPOCHS}" for e in began_after}
        wait_until(lambda task=task, wanted=wanted: wanted <= set(task.log_lines.values_list("text", flat=True)), 30,
                   what=f"{task.label}'s lines of epochs {began_after}")  # fmt: skip

    print(
        f"redis restart: stack up in {submitted - started:.1f} s; killed {killing - submitted:.1f} s after the submit, "
        f"job ended {finished - killing - OUTAGE_S:.1f} s after the restart; points measured before / during / after "
        f"the outage: {len(before)} / {len(during)} / {len(after)}; epoch ends lost at the kill: {lost}; "
        f"{len(windows_s)} train windows after the kill, the longest {max(windows_s):.2f} s; epochs "
        f"{min(epoch_s):.1f}-{max(epoch_s):.1f} s"
    )


def _began(ends: dict[tuple[int, str], dict], epoch: int) -> float:
    """When `epoch` began (wall clock), from its epoch_end point: measured at its end, with its length."""
    return ends[(epoch, "loss")]["ts"] - ends[(epoch, "epoch_time_s")]["value"]


def _assert_train_windows_follow_each_other(label: str, points: list[dict], killed_at: float) -> list[float]:
    """Within an epoch the train points' windows follow each other from the epoch's first step: each covers the steps
    since the previous point (or since the epoch began) and lasts 0.5 s plus at most one step (worker_agent/runtime/
    metrics.py), so `steps x step_time_s` of a window is below MAX_WINDOW_S. Were a report lost, its steps would count
    in the next point's window: ~1 s. Checked for every window opened after the kill (its opening point or the previous
    epoch's end was measured after it); returns their lengths."""
    step_time = {p["step"]: p["value"] for p in points if p["phase"] == "train" and p["name"] == "step_time_s"}
    train_ts = {p["step"]: p["ts"] for p in points if p["phase"] == "train" and p["name"] == "loss"}
    assert set(step_time) == set(train_ts), (label, sorted(set(step_time) ^ set(train_ts)))
    end_ts = {p["epoch"]: p["ts"] for p in points if p["phase"] == "epoch_end" and p["name"] == "loss"}
    by_epoch: dict[int, list[int]] = defaultdict(list)
    for step in sorted(train_ts):
        by_epoch[(step - 1) // STEPS_PER_EPOCH + 1].append(step)
    windows: list[float] = []
    for epoch in range(2, EPOCHS + 1):
        opened, opened_ts = (epoch - 1) * STEPS_PER_EPOCH, end_ts.get(epoch - 1, 0.0)
        for step in by_epoch.get(epoch, []):
            if opened_ts > killed_at:
                windows.append((step - opened) * step_time[step])
                assert windows[-1] < MAX_WINDOW_S, (label, epoch, opened, step, windows[-1], by_epoch[epoch])
            opened, opened_ts = step, train_ts[step]
        if opened_ts > killed_at and by_epoch.get(epoch):
            # After the epoch's last train point no window closed: less than 0.5 s of steps were left.
            rest_s = (epoch * STEPS_PER_EPOCH - opened) * step_time[opened]
            assert rest_s < MAX_WINDOW_S, (label, epoch, opened, rest_s, by_epoch[epoch])
    assert len(windows) >= 3, (label, windows, dict(by_epoch))
    return windows


def _epochs_stored(job_id: int, epoch: int) -> int:
    return (
        MetricPoint.objects.using(DB)
        .filter(job_id=job_id, phase="epoch_end", name="loss", epoch__gte=epoch)
        .values("task_id")
        .distinct()
        .count()
    )


def _wait(predicate: Callable[[], object], timeout: float, job_id: int, stack: Deployment, what: str) -> object:
    try:
        return wait_until(predicate, timeout, interval=0.1, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnose(job_id, stack)}") from None


def _diagnose(job_id: int, stack: Deployment) -> str:
    """What a failure needs: the job, its tasks with their log tails, the hosts; written whole to test-artifacts/."""
    job = Job.objects.using(DB).get(pk=job_id)
    lines = [f"job {job_id}: {job.state} {job.reason!r}"]
    for task in Task.objects.using(DB).filter(job_id=job_id):
        lines.append(f"  {task.type} {task.index}: {task.state} exit {task.exit_code} {task.detail!r}")
        tail = task.log_lines.order_by("-seq").values_list("text", flat=True)[:60]
        lines.extend(f"    | {text}" for text in reversed(tail))
    for host in Host.objects.using(DB).all():
        lines.append(f"  host {host.name}: {host.status}, last heartbeat {host.last_heartbeat}")
    text = "\n".join(lines)
    path = stack.artifacts / "redis-restart-diagnosis.txt"
    path.write_text(text)
    return f"{text[-3000:]}\n(all of it in {path}; every process's output in {stack.artifacts}/redis-restart-*.log)"
