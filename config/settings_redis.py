"""Redis and what runs over it (part of config/settings.py): one REDIS_URL for every client of the control plane, the
broker address agents are told, the cache (sign-in limits and throttles), Celery (JSON only, at least once, no remote
control) and the Channels layer."""

from __future__ import annotations

from config.env import EnvError, env_float, env_int, env_str
from kombu_redis.transport import TRANSPORT

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
