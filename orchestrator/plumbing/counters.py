"""Named counters in Redis, for things worth counting that leave no row behind (refused or stale messages)."""

from __future__ import annotations

import contextlib
import time
from functools import lru_cache

import redis
from django.conf import settings

_PREFIX = "tfdash:counter:"


@lru_cache(maxsize=1)
def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def client() -> redis.Redis:
    """The Redis connection counters use (short timeouts: whoever asks must not hang on Redis)."""
    return _client()


def key(name: str) -> str:
    """The Redis key of counter `name`, for a caller that moves it in its own MULTI with what it counts."""
    return _PREFIX + name


def incr(name: str, by: int = 1) -> None:
    with contextlib.suppress(redis.RedisError):  # a counter must never break the message path it counts
        _client().incr(key(name), by)


def get(name: str) -> int:
    value = _client().get(key(name))
    return int(value) if value else 0


def observe(name: str, seconds: float) -> None:
    """One more timing of `name`: its count and its sum (a Prometheus summary without quantiles)."""
    with contextlib.suppress(redis.RedisError):
        pipe = _client().pipeline(transaction=False)
        pipe.incr(f"{_PREFIX}{name}:count")
        pipe.incrbyfloat(f"{_PREFIX}{name}:sum", seconds)
        pipe.execute()


def observed(name: str) -> tuple[int, float]:
    """(count, sum) of the timings of `name`."""
    count, total = _client().mget(f"{_PREFIX}{name}:count", f"{_PREFIX}{name}:sum")
    return (int(count) if count else 0, float(total) if total else 0.0)


def get_many(names: list[str]) -> dict[str, int]:
    """Several counters in one round trip."""
    values = _client().mget([_PREFIX + name for name in names]) if names else []
    return {name: int(value) if value else 0 for name, value in zip(names, values, strict=True)}


_READINGS_PREFIX = "tfdash:readings:"


def record_reading(name: str, source: str, value: float) -> None:
    """Keep the latest `value` per `source` under `name` (with when it was read)."""
    record_readings(name, {source: value})


def record_readings(name: str, values: dict[str, float]) -> None:
    """`record_reading` for many sources at once (one round trip)."""
    if not values:
        return
    now = time.time()
    with contextlib.suppress(redis.RedisError):
        _client().hset(_READINGS_PREFIX + name, mapping={s: f"{float(v)!r} {now!r}" for s, v in values.items()})


def recent_readings(name: str, max_age_s: float) -> dict[str, float]:
    """The latest reading per source, for sources heard from within `max_age_s`."""
    try:
        raw = _client().hgetall(_READINGS_PREFIX + name)
    except redis.RedisError:
        return {}
    cutoff = time.time() - max_age_s
    readings = {}
    for source, packed in raw.items():
        value, at = (float(part) for part in packed.split())
        if at >= cutoff:
            readings[source.decode()] = value
    return readings
