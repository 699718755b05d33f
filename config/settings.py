"""Settings, every one overridable from the environment.

Safe by default: DEBUG is off and SECRET_KEY must come from the environment. `make run` (scripts/run_local.py) turns
DEBUG on and generates a SECRET_KEY into `var/` (mode 0600) for the local quick start; a deployment sets SECRET_KEY,
DATABASE_URL, REDIS_URL and ALLOWED_HOSTS, and TFDASH_HTTPS=1 when it is served over HTTPS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dj_database_url

from config.env import EnvError, env_bool, env_float, env_int, env_list, env_str
from contracts.protocol import WEBHOOKS_QUEUE
from kombu_redis.transport import TRANSPORT
from orchestrator.core import scheduler_policy

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("TFDASH_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
# No default, not even with DEBUG on: a known key signs sessions anyone could forge.
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    raise RuntimeError("SECRET_KEY must be set (make run generates one into var/secret-key)")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "orchestrator",
    "dashboard",
]

MIDDLEWARE = [
    # First, so every response carries the policy (dashboard/csp.py): no inline script anywhere.
    "dashboard.csp.ContentSecurityPolicyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "orchestrator.api.signin_limit.SignInLimitMiddleware",
    "dashboard.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Served over HTTPS (directly or behind a TLS proxy that sets X-Forwarded-Proto): cookies only over TLS, HSTS, and
# plain HTTP redirected. Off by default, since `make run` and the tests serve plain HTTP on loopback.
TFDASH_HTTPS = env_bool("TFDASH_HTTPS", False)
if TFDASH_HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("TFDASH_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("TFDASH_HSTS_SECONDS", 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("TFDASH_HSTS_INCLUDE_SUBDOMAINS", False)
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# DEBUG's error page (and error reports) hide passwords inside URLs too, not only settings named like a secret.
DEFAULT_EXCEPTION_REPORTER_FILTER = "config.error_reports.SecretURLFilter"

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


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
# scheduler pass (README "Sizing").
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
# One SQL dialect: the ingest's bulk upsert and the history's thinning are PostgreSQL statements.
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise EnvError(f"DATABASE_URL must name a PostgreSQL database, not {DATABASES['default']['ENGINE']}")
# A fixed test database name: live-server and subprocess tests (orchestrator, agents) must reach the same one.
DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME", "test_tfdash")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:jobs"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# Serve straight from the app folders in development so `make run` needs no collectstatic.
WHITENOISE_USE_FINDERS = DEBUG

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# One Redis address for every client of the control plane (Celery, Channels, the streams, the broker users): each
# reads this URL through redis-py's from_url, which knows no Sentinel. A Sentinel-managed Redis is reached through one
# address that follows its primary (docs/operations/two-control-planes.md).
if REDIS_URL.split("://", 1)[0].lower() not in ("redis", "rediss", "unix"):
    raise EnvError(
        f"REDIS_URL must be a redis://, rediss:// or unix:// URL, not {REDIS_URL.split('://', 1)[0]}://: the product's "
        "own Redis clients cannot follow Redis Sentinel; give one address that always reaches the primary "
        "(docs/operations/two-control-planes.md)"
    )
# The broker address shown in an agent's start command, where hosts reach Redis under another name than the control
# plane does (compose: `redis`); default REDIS_URL. Any user and password in it are dropped: an agent signs in as its
# host's own Redis user (contracts/broker.py).
TFDASH_AGENT_SERVER_URL = env_str("TFDASH_AGENT_SERVER_URL", "")
# What a joining agent is told besides (orchestrator/agents/join.py): the uid range its tasks run under when it runs
# as root ("A-B", used by no account of the hosts; empty: none), and its heartbeat interval in seconds.
TFDASH_AGENT_TASK_UIDS = env_str("TFDASH_AGENT_TASK_UIDS", "")
TFDASH_AGENT_HEARTBEAT_S = env_float("TFDASH_AGENT_HEARTBEAT_S", 3.0)

# Shared by every web process: sign-in failure counts and API throttles (orchestrator/api/signin_limit.py).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "tfdash",
        # JSON, not Django's default pickle: a value planted in the cache must never become code in the web process.
        "OPTIONS": {"serializer": "config.cache_serializer.JSONCacheSerializer"},
    }
}
# Failed sign-ins (login page, admin, POST /api/token/) allowed per client address before it is locked out for the
# rest of the window.
TFDASH_LOGIN_MAX_FAILURES = env_int("TFDASH_LOGIN_MAX_FAILURES", 5, minimum=1)
TFDASH_LOGIN_LOCKOUT_S = env_int("TFDASH_LOGIN_LOCKOUT_S", 300, minimum=1)
# Failed sign-ins to one account, from any number of clients, before the account takes no sign-in for the rest of the
# window. Four times the per-client bound: one client alone can never lock someone else's account, while a guesser
# with many addresses (a botnet, IPv6 networks) still gets no more than this many tries per account per window.
TFDASH_LOGIN_ACCOUNT_MAX_FAILURES = env_int("TFDASH_LOGIN_ACCOUNT_MAX_FAILURES", 20, minimum=1)
# API tokens (orchestrator/identity/api_tokens.py): each expires this many days after the sign-in that made it.
TFDASH_API_TOKEN_DAYS = env_int("TFDASH_API_TOKEN_DAYS", 30, minimum=1)

CELERY_BROKER_URL = REDIS_URL
# JSON only, both ways: a message in any other format (pickle above all, which runs code as it loads) is refused.
# Kombu's Redis transport, except that a malformed message is dropped and counted instead of stopping the worker.
CELERY_BROKER_TRANSPORT = TRANSPORT
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_RESULT_ACCEPT_CONTENT = ["json"]
CELERY_EVENT_SERIALIZER = "json"
# No remote control (`celery control shutdown` from anyone who can write the broker) and no events: nothing here
# needs them. The start commands add --without-gossip --without-mingle --without-heartbeat (command-line only).
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
CELERY_WORKER_SEND_TASK_EVENTS = False
CELERY_TASK_SEND_SENT_EVENT = False
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Beat sends only while its process holds the `beat` lease (orchestrator/leases/beat.py): two beats never both send.
CELERY_BEAT_SCHEDULER = "orchestrator.leases.beat:LeasedScheduler"
# At least once: a message is acknowledged only after its handler returned (its effect committed), and one whose
# worker died mid-way goes back to the queue. Handlers are idempotent, so a redelivery changes nothing.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# A message taken by a worker that then vanished comes back after this long (Kombu's default is an hour); a restarted
# orchestrator takes its own back at once (orchestrator/tasks.py). No handler runs anywhere near this long.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("TFDASH_REDELIVER_AFTER_S", 300)}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # channels-redis drops messages past `capacity` per channel without a word; frames are batched and the
        # capacity raised so a slow browser tab does not silently lose points.
        "CONFIG": {"hosts": [REDIS_URL], "capacity": 1000, "expiry": 30},
    }
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "orchestrator.api.token_auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    # Throttles key on the client address; X-Forwarded-For is believed only through this many trusted proxies.
    "NUM_PROXIES": env_int("TFDASH_NUM_PROXIES", 0),
    "DEFAULT_THROTTLE_RATES": {"login": env_str("TFDASH_LOGIN_RATE", "20/min")},
}
SPECTACULAR_SETTINGS = {
    "TITLE": "tfdash API",
    "DESCRIPTION": "Clusters, hosts and tf.distribute jobs.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "orchestrator.api.schema.declare_error_responses",
    ],
}

# Agent liveness: a host is `offline` once no heartbeat arrived for this long; the watchdog looks this often.
TFDASH_HEARTBEAT_TIMEOUT_S = env_float("TFDASH_HEARTBEAT_TIMEOUT_S", 15.0)
TFDASH_WATCHDOG_INTERVAL_S = env_float("TFDASH_WATCHDOG_INTERVAL_S", 1.0)
# A launch or kill order the agent's reports show was not acted on is sent again after this long (the agent applies
# each launch once, so a resend of one that was merely slow costs nothing).
TFDASH_ORDER_RESEND_S = env_float("TFDASH_ORDER_RESEND_S", 10.0)
# A task's exit waits for the output lines it says the task printed (a final job has its whole log); when they have
# not all come in this long (an agent's outbox dropped some in a long broker outage), it is applied with what is in.
TFDASH_EXIT_LINES_WAIT_S = env_float("TFDASH_EXIT_LINES_WAIT_S", 30.0)

# The scheduler (orchestrator/scheduler/scheduling.py): "backfill" (the default: a reservation for each of the first
# TFDASH_BACKFILL_DEPTH jobs that do not fit, and jobs behind start when they keep clear of them; priorities,
# fair share and preemption) or "fifo" (strict first come, first served, no preemption: bench/scale.py compares).
# The policies are orchestrator/core/scheduler_policy.py's table.
TFDASH_SCHEDULER_POLICY = env_str("TFDASH_SCHEDULER_POLICY", scheduler_policy.DEFAULT_POLICY)
if TFDASH_SCHEDULER_POLICY not in scheduler_policy.POLICIES:
    raise RuntimeError(
        f"TFDASH_SCHEDULER_POLICY must be {' or '.join(scheduler_policy.POLICIES)}, not {TFDASH_SCHEDULER_POLICY!r}"
    )
TFDASH_BACKFILL_DEPTH = env_int("TFDASH_BACKFILL_DEPTH", scheduler_policy.DEFAULT_BACKFILL_DEPTH, minimum=1)
# Scheduler passes over one cluster begin at least this far apart: an ask that comes sooner (a gang ended, a job was
# submitted) is taken by one pass at the end of the interval, with every other ask made meanwhile (Volcano schedules
# every second, Slurm's backfill every 30 s). A pass after a quiet spell begins at once.
TFDASH_SCHEDULE_INTERVAL_S = env_float("TFDASH_SCHEDULE_INTERVAL_S", 3.0)
# Leases of the single actors (orchestrator/leases/: one beat and one scheduler act, however many control planes run),
# Kubernetes' leader-election defaults: a lease lasts 15 s from its last renewal (the database's clock); its holder
# tries to renew every 2 s and stops acting once 10 s passed without a renewal (before anyone can take it over); a
# standby tries every 2 s. A holder that dies is replaced within LEASE + RETRY (17 s); a clean stop hands it over at
# the standby's next try. Shorter leases fail over sooner but take a stall of the holder (a long pause, a slow
# database) for a death.
TFDASH_LEASE_S = env_float("TFDASH_LEASE_S", 15.0)
TFDASH_LEASE_RENEW_DEADLINE_S = env_float("TFDASH_LEASE_RENEW_DEADLINE_S", 10.0)
TFDASH_LEASE_RETRY_S = env_float("TFDASH_LEASE_RETRY_S", 2.0)
if not 0 < TFDASH_LEASE_RETRY_S < TFDASH_LEASE_RENEW_DEADLINE_S < TFDASH_LEASE_S <= 3600:
    raise EnvError(
        "the lease settings must keep 0 < TFDASH_LEASE_RETRY_S < TFDASH_LEASE_RENEW_DEADLINE_S < TFDASH_LEASE_S "
        f"<= 3600 (now {TFDASH_LEASE_RETRY_S}, {TFDASH_LEASE_RENEW_DEADLINE_S}, {TFDASH_LEASE_S})"
    )

# What one user, job or task may hold (orchestrator/limits.py reads them; README "Limits" lists them). Each is a
# positive number: a deployment that wants more raises it, there is no "unlimited".
# Queued + running (not yet ended) jobs one user may have; a submission past it is refused, staff included.
TFDASH_MAX_ACTIVE_JOBS_PER_USER = env_int("TFDASH_MAX_ACTIVE_JOBS_PER_USER", 20, minimum=1)
# Output one task attempt may store (UTF-8 bytes, a newline per line); later lines are dropped after one marker line.
TFDASH_MAX_LOG_BYTES_PER_TASK = env_int("TFDASH_MAX_LOG_BYTES_PER_TASK", 64 * 1024 * 1024, minimum=1)
# Metric points one job stores in full; past it only every TFDASH_POINTS_THIN_STRIDE-th step (and every epoch_end
# point) is kept, and past twice it nothing more.
TFDASH_MAX_POINTS_PER_JOB = env_int("TFDASH_MAX_POINTS_PER_JOB", 1_000_000, minimum=1)
TFDASH_POINTS_THIN_STRIDE = env_int("TFDASH_POINTS_THIN_STRIDE", 10, minimum=2)
# A job with this many points not yet in its rollups gets them rolled up (orchestrator/metrics/rollups.py), at most
# TFDASH_ROLLUP_BATCH points per transaction, by a periodic task every TFDASH_ROLLUP_INTERVAL_S.
TFDASH_ROLLUP_AFTER_POINTS = env_int("TFDASH_ROLLUP_AFTER_POINTS", 50_000, minimum=1)
TFDASH_ROLLUP_BATCH = env_int("TFDASH_ROLLUP_BATCH", 500_000, minimum=1)
TFDASH_ROLLUP_INTERVAL_S = env_float("TFDASH_ROLLUP_INTERVAL_S", 10.0)
# Artifacts one job may store: how many and how many bytes in all (one artifact is at most 64 MiB: contracts/limits).
TFDASH_MAX_ARTIFACTS_PER_JOB = env_int("TFDASH_MAX_ARTIFACTS_PER_JOB", 16, minimum=1)
TFDASH_MAX_ARTIFACT_BYTES_PER_JOB = env_int("TFDASH_MAX_ARTIFACT_BYTES_PER_JOB", 256 * 1024 * 1024, minimum=1)
# On a cluster with an object store artifacts are objects there, each up to 5 GiB (contracts/store.py).
TFDASH_MAX_STORE_ARTIFACT_BYTES_PER_JOB = env_int("TFDASH_MAX_STORE_ARTIFACT_BYTES_PER_JOB", 20 * 1024**3, minimum=1)
# API tokens one user may hold at once (one per `tfdash login`, per device); expired ones do not count.
TFDASH_MAX_API_TOKENS_PER_USER = env_int("TFDASH_MAX_API_TOKENS_PER_USER", 50, minimum=1)
# An uploaded training script (form, API, `submit`).
TFDASH_MAX_SCRIPT_BYTES = env_int("TFDASH_MAX_SCRIPT_BYTES", 1024 * 1024, minimum=1)
# Points a reconnecting job page is sent at most (`?since=`); a larger backlog is replaced by a fresh thinned load.
TFDASH_SOCKET_BACKLOG_POINTS = env_int("TFDASH_SOCKET_BACKLOG_POINTS", 20_000, minimum=1)
# An open job page socket checks its user's right to the job again this often (dashboard/access.py), as well as at
# once on sign-out, on a change of the user and on every change of the job: the default is Daphne's WebSocket ping
# interval, the socket's own heartbeat.
TFDASH_SOCKET_RECHECK_S = env_float("TFDASH_SOCKET_RECHECK_S", 20.0)
# Host samples: kept whole for TFDASH_SAMPLES_FULL_S, then thinned to one per TFDASH_SAMPLES_THIN_S per host, by a
# periodic task that deletes at most TFDASH_RETENTION_BATCH rows a run (every TFDASH_RETENTION_INTERVAL_S).
TFDASH_SAMPLES_FULL_S = env_int("TFDASH_SAMPLES_FULL_S", 86_400, minimum=1)
TFDASH_SAMPLES_THIN_S = env_int("TFDASH_SAMPLES_THIN_S", 60, minimum=1)
TFDASH_RETENTION_BATCH = env_int("TFDASH_RETENTION_BATCH", 20_000, minimum=1)
TFDASH_RETENTION_INTERVAL_S = env_float("TFDASH_RETENTION_INTERVAL_S", 300.0)
# The control plane's Ed25519 signing key for orders to agents (orchestrator/identity/keys.py): a file holding it (PEM
# or base64 of the raw 32 bytes; `make run` generates var/control-key, mode 0600), else the value itself.
TFDASH_CONTROL_KEY_FILE = env_str("TFDASH_CONTROL_KEY_FILE", "")
TFDASH_CONTROL_KEY = env_str("TFDASH_CONTROL_KEY", "")
# Agent messages (contracts/signing.py) are accepted from MAX_SKEW_S ahead of this machine's clock to MAX_AGE_S old.
# Celery messages (hello, heartbeat, task events): their nonces are remembered this long, so one is never applied
# twice; 5 minutes covers a busy orchestrator's queue and its retries of a handler that met an outage.
TFDASH_MESSAGE_MAX_AGE_S = env_float("TFDASH_MESSAGE_MAX_AGE_S", 300.0)
TFDASH_MESSAGE_MAX_SKEW_S = env_float("TFDASH_MESSAGE_MAX_SKEW_S", 30.0)
# Stream entries (metrics, logs, artifacts, host samples) are refused when Redis appended them more than this long
# after the agent sealed them (orchestrator/identity/stream_marks.py), and one appended again is refused as a replay.
# Measured to the append, not the read: entries waiting while the ingest is down are kept. An agent seals as it sends,
# in the round trip that appends (5 s socket timeouts), so legitimate entries are a clock skew plus a transit old:
# two minutes leaves 90 s of transit past that skew (TFDASH_MESSAGE_MAX_SKEW_S, 30 s), and a report held through a
# broker outage is sealed afresh when it leaves (worker_agent/outbox.py).
TFDASH_STREAM_MAX_AGE_S = env_float("TFDASH_STREAM_MAX_AGE_S", 120.0)
# How many ingest processes share the hosts' metric streams (`manage.py ingest_metrics --partition P`, one process
# per P in 0..N-1; contracts/protocol.py ingest_partition): every process must be started with the same N.
TFDASH_INGEST_PARTITIONS = max(1, int(env_float("TFDASH_INGEST_PARTITIONS", 1)))
# The ingest is behind when the oldest metric-stream entry it has not stored is older than this: the cluster page tells
# the staff (with how to add partitions), and GET /metrics says so (tfdash_ingest_behind).
TFDASH_INGEST_BEHIND_S = env_float("TFDASH_INGEST_BEHIND_S", 10.0)
# GET /metrics for a scraper without a session: `Authorization: Bearer <this>` (empty: staff sessions only).
TFDASH_METRICS_TOKEN = env_str("TFDASH_METRICS_TOKEN", "")
# Webhooks (orchestrator/webhooks/): how often the outbox is swept, a sweep's time for starting POSTs, one POST's
# deadline in all (name lookup, connect, send, read: GitHub gives a delivery 10 s), how many POSTs one sweep has in
# flight at once, the retries' backoff (doubling from BASE up to MAX) and how many tries before a delivery is failed.
TFDASH_WEBHOOK_SWEEP_S = env_float("TFDASH_WEBHOOK_SWEEP_S", 2.0)
TFDASH_WEBHOOK_SWEEP_BUDGET_S = env_float("TFDASH_WEBHOOK_SWEEP_BUDGET_S", 20.0)
TFDASH_WEBHOOK_DEADLINE_S = env_float("TFDASH_WEBHOOK_DEADLINE_S", 10.0)
TFDASH_WEBHOOK_CONCURRENCY = env_int("TFDASH_WEBHOOK_CONCURRENCY", 16, minimum=1)
TFDASH_WEBHOOK_RETRY_BASE_S = env_float("TFDASH_WEBHOOK_RETRY_BASE_S", 5.0)
TFDASH_WEBHOOK_RETRY_MAX_S = env_float("TFDASH_WEBHOOK_RETRY_MAX_S", 600.0)
TFDASH_WEBHOOK_MAX_ATTEMPTS = env_int("TFDASH_WEBHOOK_MAX_ATTEMPTS", 15, minimum=1)
# The dashboard's address as receivers should link to it (webhook payloads); empty: links are paths only.
TFDASH_PUBLIC_URL = env_str("TFDASH_PUBLIC_URL", "")

CELERY_BEAT_SCHEDULE = {
    "host-watchdog": {
        "task": "orchestrator.watchdog",
        "schedule": TFDASH_WATCHDOG_INTERVAL_S,
        "options": {"expires": TFDASH_WATCHDOG_INTERVAL_S * 2},
    },
    "webhooks": {
        "task": "orchestrator.webhooks",
        "schedule": TFDASH_WEBHOOK_SWEEP_S,
        # Their own queue and worker: a POST never holds a thread of the hosts' events, the watchdog or scheduling.
        "options": {"expires": TFDASH_WEBHOOK_SWEEP_S * 2, "queue": WEBHOOKS_QUEUE},
    },
    "rollups": {
        "task": "orchestrator.rollups",
        "schedule": TFDASH_ROLLUP_INTERVAL_S,
        "options": {"expires": TFDASH_ROLLUP_INTERVAL_S},
    },
    "retention": {
        "task": "orchestrator.retention",
        "schedule": TFDASH_RETENTION_INTERVAL_S,
        "options": {"expires": TFDASH_RETENTION_INTERVAL_S},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        # One line per heartbeat and watchdog tick would drown everything worth reading.
        # TFDASH_TRACE_LOG_LEVEL=INFO logs each handler's run time ("... succeeded in 0.004s"): bench/scale.py reads it.
        "celery.app.trace": {"level": env_str("TFDASH_TRACE_LOG_LEVEL", "WARNING")},
        "celery.worker.strategy": {"level": "WARNING"},
        "celery.beat": {"level": "WARNING"},
    },
}
