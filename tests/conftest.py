"""Shared fixtures: real Redis and PostgreSQL, a real orchestrator worker, real agent processes."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from django.conf import settings

from contracts import broker
from contracts.broker import without_credentials
from contracts.protocol import ORCHESTRATOR_QUEUE, SCHEDULER_QUEUE
from tests.support.object_store import ObjectStore, running_store
from tests.support.processes import ManagedProcess

AGENT_HEARTBEAT_S = 0.5
# As in CI (root): test agents run each job's tasks under a uid of its own. Empty when not root.
TASK_UIDS = "20000-29999" if os.geteuid() == 0 else ""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that start the session's real orchestrator run after all the others. Its beat runs the watchdog every
    half second over the whole test database: a unit test that drives the lifecycle by hand (hang detection, host
    liveness) must not race it. The sort is stable, so pytest-django's order holds within each part."""
    items.sort(key=lambda item: "orchestrator" in getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session")
def redis_url() -> str:
    return settings.REDIS_URL


@pytest.fixture(scope="session", autouse=True)
def _retry_flush_on_deadlock() -> None:
    """Transactional tests end with a TRUNCATE of every table, while the real orchestrator and ingest worker may
    still be storing the last messages of a job (a metric batch, an exit event). PostgreSQL then resolves the lock
    cycle by aborting one side; when that side is the flush, it is simply done again."""
    from django.test import TransactionTestCase

    original = TransactionTestCase._fixture_teardown

    def teardown(self: TransactionTestCase) -> None:
        for attempt in range(5):
            try:
                return original(self)
            except Exception as exc:
                if attempt == 4 or not _caused_by_deadlock(exc):
                    raise
                time.sleep(0.2 * (attempt + 1))
        return None

    TransactionTestCase._fixture_teardown = teardown  # type: ignore[method-assign]


def _caused_by_deadlock(exc: BaseException | None) -> bool:
    while exc is not None:
        if "deadlock detected" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@pytest.fixture(scope="session", autouse=True)
def _empty_test_redis(redis_url: str) -> None:
    # The test Redis database is the suite's alone: start from nothing so no queued message leaks between runs.
    redis.Redis.from_url(redis_url).flushdb()


@pytest.fixture
def alice(django_user_model):  # type: ignore[no-untyped-def]
    """A signed-up user who owns things in a test; `bob` is the outsider."""
    return django_user_model.objects.create_user("alice", password="pw-alice-123")


@pytest.fixture
def bob(django_user_model):  # type: ignore[no-untyped-def]
    return django_user_model.objects.create_user("bob", password="pw-bob-123")


def _database_url() -> str:
    from django.db import connection

    db = connection.settings_dict
    auth = quote(db["USER"] or "")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture(scope="session")
def service_env(django_db_setup: None, redis_url: str) -> dict[str, str]:
    """Environment for processes that must see the test database (the orchestrator, the web server)."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": _database_url(),
        "REDIS_URL": redis_url,
        "TFDASH_HEARTBEAT_TIMEOUT_S": str(settings.TFDASH_HEARTBEAT_TIMEOUT_S),
        "TFDASH_WATCHDOG_INTERVAL_S": str(settings.TFDASH_WATCHDOG_INTERVAL_S),
        "TFDASH_ORDER_RESEND_S": str(settings.TFDASH_ORDER_RESEND_S),
        "TFDASH_SCHEDULE_INTERVAL_S": str(settings.TFDASH_SCHEDULE_INTERVAL_S),
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture(scope="session")
def orchestrator(service_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    """One real control plane for the session, laid out as the product ships it (scripts/run_local.py): the
    orchestrator (Celery worker + beat on the `orchestrator` queue), the scheduler's worker (the `scheduler` queue,
    one pass at a time), the webhooks worker (the `webhooks` queue) and the metrics ingest."""
    beat_file = tmp_path_factory.mktemp("beat") / "schedule"
    proc = ManagedProcess(
        "orchestrator",
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "orchestrator", "-B",
         "--without-gossip", "--without-mingle", "--without-heartbeat",
         "--pool", "threads", "-c", "4", "-l", "INFO", "--hostname", "orchestrator-test@%h", "-s", str(beat_file)],
        service_env,
    )  # fmt: skip
    scheduler = ManagedProcess(
        "scheduler",
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "scheduler",
         "--without-gossip", "--without-mingle", "--without-heartbeat",
         "--pool", "threads", "-c", "1", "-l", "INFO", "--hostname", "scheduler-test@%h"],
        service_env,
    )  # fmt: skip
    # Webhook deliveries in a worker of their own, as shipped: a slow receiver holds none of the orchestrator's threads.
    webhooks = ManagedProcess(
        "webhooks",
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "webhooks",
         "--without-gossip", "--without-mingle", "--without-heartbeat",
         "--pool", "threads", "-c", "1", "-l", "INFO", "--hostname", "webhooks-test@%h"],
        service_env,
    )  # fmt: skip
    # The one consumer of the agents' metric stream (point ids grow in commit order).
    ingest = ManagedProcess("ingest", [sys.executable, "manage.py", "ingest_metrics"], service_env)
    proc.wait_for_line(r"orchestrator-test@\S+ ready", timeout=60)
    scheduler.wait_for_line(r"scheduler-test@\S+ ready", timeout=60)
    webhooks.wait_for_line(r"webhooks-test@\S+ ready", timeout=60)
    ingest.wait_for_line(r"metrics ingest \S+ ready", timeout=60)
    proc.scheduler = scheduler  # type: ignore[attr-defined]  # tests that look at the scheduler's own process
    proc.webhooks = webhooks  # type: ignore[attr-defined]  # and the webhooks worker's
    yield proc
    for each in (proc, scheduler, webhooks, ingest):
        each.stop()
    # Kept for reading after a failure (CI prints test-artifacts/ paths; locally it is beside the checkout).
    for each in (proc, scheduler, webhooks, ingest):
        (_artifacts() / f"{each.name}.log").write_text(each.output())


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temporary folder that task uids can enter (pytest's tmp_path is under a 0700 folder): for agents' workdirs
    and clusters' shared folders; a folder tasks write to must be made writable for them (chmod 1777)."""
    path = Path(tempfile.mkdtemp(prefix="tfdash-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def start_agent(redis_url: str, open_tmp: Path) -> Iterator[Callable[..., ManagedProcess]]:
    """Start real `python -m worker_agent` processes; every one is killed at the end of the test.

    As an operator should: the token in a 0600 file, the broker URL in the environment (a command line is readable
    by every local user), and, as root, tasks under their own uids (TASK_UIDS). Their shared roots (--shared-root):
    `open_tmp/shared`, the clusters' shared folder (tests/orchestrator/conftest.py), and `open_tmp` itself, where tests
    read what a task wrote: as root a task's /tmp is its own, so it reaches nothing else of the host's /tmp."""
    started: list[ManagedProcess] = []

    from orchestrator.identity.keys import control_public_key

    def start(host: str, token: str, *extra: str) -> ManagedProcess:
        workdir = open_tmp / f"agent-{host}"
        workdir.mkdir(exist_ok=True)
        (open_tmp / "shared").mkdir(exist_ok=True)
        token_file = workdir / "token"
        token_file.touch(mode=0o600)
        token_file.write_text(token)
        # The broker's address alone: the agent signs in as its host's own Redis user (contracts/broker.py).
        env = {**os.environ, "TFDASH_SERVER": without_credentials(redis_url), "PYTHONUNBUFFERED": "1"}
        env.pop("DJANGO_SETTINGS_MODULE", None)  # the agent must work without Django
        env.pop("TFDASH_CONTROL_KEY_FILE", None)  # nor may it see the control plane's private key
        uids = ("--task-uids", TASK_UIDS) if TASK_UIDS else ()
        # The control plane's public key, which every order must be signed by, by flag (it is no secret).
        proc = ManagedProcess(
            f"agent-{host}",
            [sys.executable, "-m", "worker_agent", "--host", host, "--token-file", str(token_file), *uids,
             "--control-key", control_public_key(),
             "--shared-root", str(open_tmp / "shared"), "--shared-root", str(open_tmp),
             "--heartbeat-interval", str(AGENT_HEARTBEAT_S), "--workdir", str(workdir), *extra],
            env,
        )  # fmt: skip
        proc.host = host  # type: ignore[attr-defined]
        started.append(proc)
        return proc

    start.started = started  # type: ignore[attr-defined]  # tests may pick one to kill
    yield start
    for proc in started:
        # SIGTERM first: the agent then kills its TF processes (their own sessions), so no test leaves orphans.
        if proc.proc.poll() is None:
            proc.terminate(timeout=20)
        proc.stop()
    # Let the orchestrator and ingest worker take what the agents last sent before the test's tables are emptied.
    queues = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 15
    # A host's events and metrics streams hold only entries not handled yet (readers delete what they acknowledged).
    streams = [broker.stream(proc.host, kind) for proc in started for kind in (broker.EVENTS, broker.METRICS)]
    while time.monotonic() < deadline and (
        queues.llen(ORCHESTRATOR_QUEUE)
        or queues.llen(SCHEDULER_QUEUE)
        or any(queues.xlen(stream) for stream in streams)
    ):
        time.sleep(0.1)


def _artifacts() -> Path:
    path = Path(os.environ.get("TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def artifacts_dir() -> Path:
    return _artifacts()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[ObjectStore]:
    """A real S3 (a moto server process behind a SigV4 gate: tests/support/object_store.py), one for the session."""
    with running_store() as store:
        yield store


@pytest.fixture
def object_store(moto_server: ObjectStore) -> Iterator[ObjectStore]:
    """The session's store, emptied after each test."""
    yield moto_server
    moto_server.empty()
