"""How Django's cache writes values into Redis: JSON, never pickle.

Django's RedisCache unpickles what it reads by default, so anyone able to write one cache key could run code in every
web process that reads it. Here an int is stored raw (so Redis' INCR, which `cache.incr` uses, works on it, as with
Django's own serializer) and everything else as JSON. What does not decode (a value someone else wrote) reads as a
miss, logged, never as code and never as an error page.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)


class JSONCacheSerializer:
    def __init__(self, protocol: int | None = None) -> None:
        pass  # RedisCacheClient may pass a pickle protocol; there is none here

    def dumps(self, obj: Any) -> int | bytes:
        # type(), not isinstance(): a bool is stored as JSON and comes back a bool.
        if type(obj) is int:
            return obj
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")

    def loads(self, data: bytes) -> Any:
        try:
            return int(data)
        except ValueError:
            pass
        try:
            return json.loads(data)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError both
            log.warning("a cache value is not JSON (%d bytes): read as a miss", len(data))
            return None
