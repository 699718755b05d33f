"""Test settings: the real services, with short liveness timeouts so agent tests finish in seconds.

Environment defaults are set before config.settings reads them; subprocesses started by tests (orchestrator,
agents) receive the same values explicitly.
"""

from __future__ import annotations

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tfdash")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("TFDASH_HEARTBEAT_TIMEOUT_S", "4")
os.environ.setdefault("TFDASH_WATCHDOG_INTERVAL_S", "0.5")

from config.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast test users
