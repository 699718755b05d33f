"""Test settings: the real services, with short liveness timeouts so agent tests finish in seconds.

Environment defaults are set before config.settings reads them; subprocesses started by tests (orchestrator,
agents) receive the same values explicitly.
"""

from __future__ import annotations

import os

# The suite's own key and the development settings its servers (web, orchestrator) ran with before DEBUG became
# off by default: static files from the app folders, tracebacks in the logs of a failed test.
os.environ.setdefault("SECRET_KEY", "test-suite-only-" + "k" * 40)
os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tfdash")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("TFDASH_HEARTBEAT_TIMEOUT_S", "4")
os.environ.setdefault("TFDASH_WATCHDOG_INTERVAL_S", "0.5")
os.environ.setdefault("TFDASH_ORDER_RESEND_S", "2")

from config.settings import *  # noqa: F403

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
