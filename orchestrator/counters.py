"""Named counters in Redis, for things worth counting that leave no row behind (refused or stale messages)."""

from __future__ import annotations

from functools import lru_cache

import redis
from django.conf import settings

_PREFIX = "tfdash:counter:"


@lru_cache(maxsize=1)
def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def incr(name: str) -> None:
    try:
        _client().incr(_PREFIX + name)
    except redis.RedisError:
        pass  # a counter must never break the message path it counts


def get(name: str) -> int:
    value = _client().get(_PREFIX + name)
    return int(value) if value else 0
