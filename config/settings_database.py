"""The database settings (part of config/settings.py): PostgreSQL only, at DATABASE_URL; how long a connection is kept
by a Celery worker thread, and the web server's pool; a lock timeout; and dead-peer detection on both ends of a
connection."""

from __future__ import annotations

from typing import Any

import dj_database_url

from config.env import EnvError, env_bool, env_int, env_str


def _dead_peer_options(seconds: int, *, server: bool) -> Any:
    """TCP keepalives (idle ~40 %, then probes every ~15 % of `seconds`, 3 of them) and a limit on unacknowledged
    data of `seconds`: as server settings for `options` (its end of the connection), or as libpq's parameters."""
    idle, interval = max(1, seconds * 2 // 5), max(1, seconds * 3 // 20)
    if server:
        return (f" -c tcp_keepalives_idle={idle} -c tcp_keepalives_interval={interval} -c tcp_keepalives_count=3"
                f" -c tcp_user_timeout={seconds * 1000}")  # fmt: skip
    return {"keepalives": 1, "keepalives_idle": idle, "keepalives_interval": interval, "keepalives_count": 3,
            "tcp_user_timeout": seconds * 1000}  # fmt: skip


DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tfdash"),
        conn_max_age=env_int("DB_CONN_MAX_AGE", 0),
    )
}
# How long a Celery worker's thread keeps its database connection between messages (config/celery.py sets it when a
# worker starts). The web server opens one per request as Django advises under ASGI (DB_CONN_MAX_AGE, 0); a worker
# that did the same opened a connection, a new PostgreSQL backend and a SCRAM exchange, for every heartbeat, event and
# scheduler pass (docs/sizing.md).
TFDASH_WORKER_CONN_MAX_AGE = env_int("DB_WORKER_CONN_MAX_AGE", 60)
# A statement waiting for a row lock longer than this fails (a Celery handler is then retried with backoff) instead of
# holding a worker thread indefinitely.
DATABASES["default"].setdefault("OPTIONS", {})["options"] = (
    f"-c lock_timeout={env_int('TFDASH_DB_LOCK_TIMEOUT_MS', 10_000)}"
    # A peer gone silent (a control-plane machine cut off the network, not shut down) is given up after about
    # TFDASH_DB_DEAD_PEER_S, by both ends: the server ends that backend, so the row locks of the transaction it left
    # open stop blocking the other machine's workers (measured: 15 s of lock timeouts on the survivor while a cut-off
    # plane's transactions held job rows), and the cut-off worker's own calls fail instead of hanging.
    + _dead_peer_options(env_int("TFDASH_DB_DEAD_PEER_S", 12, minimum=3), server=True)
)
for _key, _value in _dead_peer_options(env_int("TFDASH_DB_DEAD_PEER_S", 12, minimum=3), server=False).items():
    DATABASES["default"]["OPTIONS"].setdefault(_key, _value)  # a value in DATABASE_URL's query wins
# The web server takes its connections from a pool (config/asgi.py sets TFDASH_DB_POOL for that process alone): it
# opened one per database call under ASGI, a new PostgreSQL backend and a SCRAM exchange each, which was most of a
# job page's WebSocket open (bench/page_load.py, `sock open`: ~100 ms of its session and rights checks). Django has
# the pool check each connection as it hands it out, so one left broken by a PostgreSQL restart is replaced.
# Workers keep theirs per thread instead (TFDASH_WORKER_CONN_MAX_AGE); Django refuses a pool beside CONN_MAX_AGE.
if env_bool("TFDASH_DB_POOL", False):
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": 1,
        "max_size": env_int("TFDASH_DB_POOL_MAX", 8, minimum=1),
        "timeout": 10,  # a request waiting longer for a free connection fails rather than hang
    }
# One SQL dialect: the ingest's bulk upsert and the history's thinning are PostgreSQL statements.
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise EnvError(f"DATABASE_URL must name a PostgreSQL database, not {DATABASES['default']['ENGINE']}")
# A fixed test database name: live-server and subprocess tests (orchestrator, agents) must reach the same one.
DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME", "test_tfdash")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
