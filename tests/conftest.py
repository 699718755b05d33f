"""Shared fixtures: real Redis and PostgreSQL, a real orchestrator worker, real agent processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from contracts import broker
from contracts.broker import without_credentials
from contracts.protocol import ORCHESTRATOR_QUEUE, SCHEDULER_QUEUE
from scripts.celery_workers import worker_argv
from tests.support import probe_cache as probes
from tests.support.databases import database_url
from tests.support.object_store import ObjectStore, running_store
from tests.support.processes import ManagedProcess
from tests.support.task_uids import TASK_UIDS

AGENT_HEARTBEAT_S = 0.5
# `make test` runs the suite on two pytest-xdist workers (gw0, gw1): each has its own test databases (pytest-django
# suffixes their names) and its own task uids (tests/support/task_uids.py), so the agents of one never hand the
# other's uids to a job, nor kill the other's processes, and its own Redis (tests/settings.py).


# Test tiers (docs/development/testing.md). `make test` runs every test; `make test-fast` (TFDASH_TEST_TIER=fast) runs
# those without any of the slow kinds below: unit, API and contract tests, for the inner loop. A test's kind follows
# from where it lies and from the fixtures it uses (their whole closure: a fixture that uses `start_agent` starts TF
# too), so a new test is sorted by what it does, not by a decorator someone must remember.
SLOW_KINDS = ("tf", "e2e", "browser", "bench", "soak", "netns", "slow")  # each described in pyproject.toml's markers
FAST_TIER = "fast"
_FIXTURE_KINDS = {
    "start_agent": ("tf",),  # real agents: each probes its TensorFlow environments, then runs jobs' tasks
    "supervisor": ("tf",),  # the agent's supervisor: launches task programs, TF ones among them
    "netns_cluster": ("tf", "e2e"),
    "agent_venv": ("tf", "e2e"),  # pip installs ./agent into a venv of its own; its agents run TF tasks
    "orchestrator": ("e2e",),
    "web": ("e2e",),
    "join_server": ("e2e",),
    "control_plane": ("e2e",),
    "private_redis": ("tf", "e2e"),  # a Redis to restart under a control plane and agents the test starts itself
    "browser": ("browser",),
}
# Folders, files and tests (node id prefixes) that start such processes themselves (ManagedProcess, subprocess)
# rather than by fixture, or import TensorFlow in the test process.
_PATH_KINDS = {
    "tests/bench/": ("bench", "e2e"),
    "tests/bench/test_chaos.py": ("soak", "tf"),
    "tests/browser/": ("browser", "e2e"),
    "tests/network/": ("netns",),
    "tests/agent_dist/": ("tf", "e2e"),
    "tests/worker_agent/runtime/test_builtin_programs.py": ("tf",),
    "tests/worker_agent/runtime/test_injected_hook.py": ("tf",),
    "tests/worker_agent/runtime/test_input_bound_scripts.py": ("tf",),
    "tests/worker_agent/runtime/test_probe.py": ("tf",),
    "tests/worker_agent/runtime/test_step_preemption.py": ("tf",),  # a two-worker MultiWorkerMirrored gang, stopped
    "tests/worker_agent/runtime/test_tf215_env.py": ("tf",),
    "tests/scripts/test_run_local.py::test_make_run_": ("tf", "e2e"),  # the whole stack, as `make run` starts it
    "tests/worker_agent/environments/test_known.py::test_a_real_probe": ("tf",),
    # These import TensorFlow in the test process, to have it parse what the product wrote.
    "tests/orchestrator/api/test_jobs_api.py::test_the_plan_gives_every_task_a_tf_config_tensorflow_accepts": ("tf",),
    "tests/orchestrator/core/test_tf_config.py::test_it_writes_tf_configs_that_tensorflow_parses": ("tf",),
    # These read the export back with TensorBoard's reader, which imports TensorFlow.
    "tests/orchestrator/metrics/test_tensorboard_export.py::test_it_reads_back": ("tf",),
    "tests/orchestrator/metrics/test_tensorboard_export.py::test_archive_member_names": ("tf",),
    "tests/orchestrator/leases/test_failover_e2e.py": ("e2e",),  # two control planes of its own
    "tests/orchestrator/diagnosis/test_corpus_tf.py": ("tf",),  # the corpus scripts that need TensorFlow, run once
    "tests/orchestrator/test_startup_checks.py": ("e2e",),  # each control-plane process, started to see it refuse
    "tests/orchestrator/test_start_during_outage.py": ("e2e",),  # an orchestrator worker started with its database away
    "tests/orchestrator/webhooks/test_delivery.py::test_a_receiver_down_for_30_s": ("slow",),
    "tests/api/test_fuzz.py": ("slow",),  # every operation of the schema, 15 examples each: minutes
}


def _tier() -> str:
    return os.environ.get("TFDASH_TEST_TIER", "")


def pytest_configure(config: pytest.Config) -> None:
    registered = {line.split(":", 1)[0].strip() for line in config.getini("markers")}
    assert set(SLOW_KINDS) <= registered, f"register {set(SLOW_KINDS) - registered} in pyproject.toml's markers"
    if _tier() == FAST_TIER:
        fast = "not (" + " or ".join(SLOW_KINDS) + ")"
        given = config.option.markexpr
        config.option.markexpr = f"({given}) and {fast}" if given else fast
        _watch_tensorflow()


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks each test with the slow kinds it belongs to (SLOW_KINDS), from its path and its fixtures."""
    kinds = {kind for prefix, each in _PATH_KINDS.items() if item.nodeid.startswith(prefix) for kind in each}
    for name in getattr(item, "fixturenames", ()):
        kinds.update(_FIXTURE_KINDS.get(name, ()))
    for kind in sorted(kinds - {mark.name for mark in item.iter_markers()}):
        item.add_marker(kind)
    item.add_marker(pytest.mark.xdist_group(_worker_group(item.nodeid, kinds)))


# The two workers' groups (`make test`: `-n 2 --dist loadgroup`). The tests whose agents run TensorFlow on this
# machine's loopback share one worker and run one at a time, as they did in one process: their clusters' TF ports
# (tests/factories.py and the tests' own ranges, 23000-29999) and the machine's cores are theirs. Everything else runs
# on the other worker: unit, API and browser tests, the benches (the chaos soak's and the failover's stacks take
# their TF ports from 10000-20000), hosts with their own addresses (tests/network: ports of their own namespaces), and
# TF tests that run no job on a registered host: TF processes started directly on ports of the test worker's own
# (tests/support/ports.py), and `make run`'s stack, whose hosts run no job in its tests. That last part also evens
# the two workers out: beside stress-ng --cpu 1, `loopback-tf` took 1,757 s and the others 1,286 s before it; on
# 2026-11-28, quiet, 2,193 s and 1,871 s, before the runtime's step-preemption and input-bound tests joined them.
_OWN_STACKS = (
    "tests/bench/",
    "tests/orchestrator/leases/test_failover_e2e.py",
    "tests/network/",
    "tests/worker_agent/runtime/test_builtin_programs.py",
    "tests/worker_agent/runtime/test_step_preemption.py",
    "tests/worker_agent/runtime/test_input_bound_scripts.py",
    "tests/orchestrator/diagnosis/test_corpus_tf.py",
    "tests/scripts/test_run_local.py",
)


def _worker_group(nodeid: str, kinds: set[str]) -> str:
    return "loopback-tf" if "tf" in kinds and not nodeid.startswith(_OWN_STACKS) else "others"


# The fast tier's honesty, beyond the marks: a fixture of a slow kind refuses to start (one a test asks for by
# request.getfixturevalue is not in its closure), and a test fails when TensorFlow was loaded while it ran, in the
# test process or in any process below it (its children, their children: an agent's tasks, whatever PYTHONPATH,
# interpreter or uid they run with), seen by TensorFlow's library in the process's memory map. Importing TensorFlow
# takes seconds, so looking every 0.2 s misses none.
_TENSORFLOW_SEEN: list[str] = []
_WATCH: list[threading.Thread] = []  # the watching thread, once the fast tier started it


def _watch_tensorflow() -> None:
    class Recorder:  # the test process's own import
        @staticmethod
        def find_spec(name: str, *_args: object) -> None:
            if name == "tensorflow":
                _TENSORFLOW_SEEN.append(f"pid {os.getpid()}: the test process itself imports tensorflow")

    sys.meta_path.insert(0, Recorder)  # type: ignore[arg-type]

    def below(pid: int) -> list[int]:
        found, todo = [], [pid]
        while todo:
            for children in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
                with contextlib.suppress(OSError, ValueError):
                    kids = [int(each) for each in children.read_text().split()]
                    found += kids
                    todo += kids
        return found

    def loads_tensorflow(pid: int) -> bool:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
            return any("_pywrap_tensorflow" in line for line in maps)
        return False

    def watch() -> None:
        seen: set[int] = set()
        # Paced by an Event, not time.sleep: a test may patch time.sleep (the module is every thread's), and this
        # thread must neither die of that nor call what the test put there.
        pace = threading.Event()
        while not pace.wait(0.2):
            for pid in below(os.getpid()):
                if pid not in seen and loads_tensorflow(pid):
                    seen.add(pid)
                    with contextlib.suppress(OSError):
                        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:400]
                        _TENSORFLOW_SEEN.append(f"pid {pid}: {argv}")

    _WATCH.append(threading.Thread(target=watch, name="fast-tier-tensorflow-watch", daemon=True))
    _WATCH[0].start()


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_tensorflow() -> Iterator[None]:
    start = len(_TENSORFLOW_SEEN)
    yield
    if _tier() == FAST_TIER and len(_TENSORFLOW_SEEN) > start:
        seen = "\n".join(_TENSORFLOW_SEEN[start:])
        pytest.fail(
            f"a test of the fast tier loaded TensorFlow: mark it tf (tests/conftest.py _PATH_KINDS, _FIXTURE_KINDS):\n"
            f"{seen}",
            pytrace=False,
        )
    if _WATCH and not _WATCH[0].is_alive():  # a dead watch would pass every later test of the tier unseen
        pytest.fail("the fast tier's TensorFlow watch died in this test (see its thread's exception)", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> None:
    kinds = _FIXTURE_KINDS.get(fixturedef.argname, ())
    if kinds and _tier() == FAST_TIER:
        pytest.fail(f"the fast tier starts no {fixturedef.argname} ({', '.join(kinds)}): mark the test", pytrace=False)


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


@pytest.fixture(scope="session")
def service_env(django_db_setup: None, redis_url: str) -> dict[str, str]:
    """Environment for processes that must see the test database (the orchestrator, the web server)."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url(),
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
        "orchestrator", worker_argv("orchestrator", 4, "orchestrator-test@%h", beat_schedule=beat_file), service_env
    )
    scheduler = ManagedProcess("scheduler", worker_argv("scheduler", 1, "scheduler-test@%h"), service_env)
    # Webhook deliveries in a worker of their own, as shipped: a slow receiver holds none of the orchestrator's threads.
    webhooks = ManagedProcess("webhooks", worker_argv("webhooks", 1, "webhooks-test@%h"), service_env)
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


@pytest.fixture(scope="session")
def probe_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every probe result this test worker's agents found so far, by interpreter file key: see `start_agent`."""
    return tmp_path_factory.mktemp("probe-cache") / "probes.json"


@pytest.fixture
def start_agent(redis_url: str, open_tmp: Path, probe_cache: Path) -> Iterator[Callable[..., ManagedProcess]]:
    """Start real `python -m worker_agent` processes; every one is killed at the end of the test.

    As an operator should: the token in a 0600 file, the broker URL in the environment (a command line is readable
    by every local user), and, as root, tasks under their own uids (TASK_UIDS). Their shared roots (--shared-root):
    `open_tmp/shared`, the clusters' shared folder (tests/orchestrator/conftest.py), and `open_tmp` itself, where tests
    read what a task wrote: as root a task's /tmp is its own, so it reaches nothing else of the host's /tmp.

    Each starts as an agent restarted on a host whose interpreters it probed before, with the probes this test
    worker's earlier agents made (tests/support/probe_cache.py). The first agent of the session, and any agent told of
    an interpreter not probed yet (tests/orchestrator/environments builds its own), probe for real."""
    started: list[ManagedProcess] = []
    workdirs: list[Path] = []  # once each: an agent started again on its host keeps its workdir

    from orchestrator.identity.keys import control_public_key

    def start(host: str, token: str, *extra: str) -> ManagedProcess:
        workdir = open_tmp / f"agent-{host}"
        workdir.mkdir(exist_ok=True)
        probes.seed(workdir, probe_cache)
        if workdir not in workdirs:
            workdirs.append(workdir)
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
    # SIGTERM first: the agent then kills its TF processes (their own sessions), so no test leaves orphans. All asked
    # at once: each may wait seconds for its broker to take its last words (worker_agent/app.py shutdown).
    running = [proc for proc in started if proc.proc.poll() is None]
    for proc in running:
        proc.ask_to_stop()
    for proc in running:
        proc.wait_stopped(timeout=20)
    for proc in started:
        proc.stop()
    probes.keep(probe_cache, workdirs)
    # Let the orchestrator and ingest worker take what the agents last sent before the test's tables are emptied.
    from orchestrator.plumbing.streams import HOSTS_REFRESH_S

    queues = redis.Redis.from_url(redis_url)
    began = time.monotonic()
    deadline = began + 15
    # A host's events and metrics streams hold only entries not handled yet (readers delete what they acknowledged).
    streams = [broker.stream(proc.host, kind) for proc in started for kind in (broker.EVENTS, broker.METRICS)]

    def read_by_someone(stream: str) -> bool:
        """Entries a reader will take: its stream has a readers' group, or may have one soon (a reader finds a new
        host's streams within a second). A host the database does not know, or a test without the session's
        orchestrator, leaves entries nobody reads: not waited for."""
        if not queues.xlen(stream):
            return False
        with contextlib.suppress(redis.ResponseError):
            if queues.xinfo_groups(stream):
                return True
        return time.monotonic() < began + 2 * HOSTS_REFRESH_S

    while time.monotonic() < deadline and (
        queues.llen(ORCHESTRATOR_QUEUE) or queues.llen(SCHEDULER_QUEUE) or any(map(read_by_someone, streams))
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
