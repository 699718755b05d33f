"""The Redis transport of every Celery app here (the orchestrator's, the web's, every agent's): Kombu's own, except
that a malformed message on a queue is dropped, logged (bounded) and counted, and the consumer goes on.

Why a subclass, and why a private method: Kombu's Redis channel (`kombu.transport.redis.Channel._brpop_read`, Kombu
5.5.4) pops one list item and runs `deliver(loads(item))` inline. Anyone who can write a queue can make that raise:
non-JSON (`JSONDecodeError`), JSON of the wrong shape (`KeyError`/`TypeError` in `Message()` or `QoS.append`), or a
Kombu envelope Celery's task handler chokes on (headers that are not an object). The error escapes Celery's consumer
loop, and Celery stops the worker ("Unrecoverable error"); a message that failed after `QoS.append` is even put back
on the queue at shutdown, so the restarted worker dies on it again. Neither library has a hook before that decode
(celery/celery#4308, celery/kombu#2421, both open), so `_brpop_read` is overridden here: its body is Kombu 5.5.4's,
with the one `deliver(loads(item))` line replaced by `_deliver_item`. Kombu is pinned in pyproject.toml, and
tests/kombu_redis/test_transport.py fails when the upstream method changes (UPSTREAM_BRPOP_READ_SHA256) and shows a real
worker surviving junk.

Selected by Celery's `broker_transport` setting ("kombu_redis.transport:Transport"): Kombu resolves a transport given as
an import path, and parses the `redis://` URL (host, port, user, password, db) exactly as for its own alias.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads

log = logging.getLogger(__name__)

TRANSPORT = "kombu_redis.transport:Transport"
# The method overridden below, as Kombu 5.5.4 has it (sha256 of inspect.getsource): a Kombu upgrade that changes it
# fails tests/kombu_redis/test_transport.py, so the copy is looked at again.
UPSTREAM_BRPOP_READ_SHA256 = "9a9f7f5a6ad96f489d92b73bbca160faf840e55c12405e58d89b33393787c92a"
# Likewise `_put`, whose key and body a batch (Channel.batched_puts) makes as it does.
UPSTREAM_PUT_SHA256 = "37bb64c990c13d9ac4d98b7b15c26cb6c6a8e60127b8b64d35e8e440ccca8064"

# A message larger than this is dropped unread (the transport option `max_message_bytes` changes it). The largest
# real one is a launch order, which carries its script (TFDASH_MAX_SCRIPT_BYTES, 1 MiB by default) base64-encoded
# twice (the order, then Kombu's body): 16 MiB leaves room for scripts of up to about 9 MiB.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Celery logs a message's headers whole when it cannot handle it (an unknown task name): they are bounded too. Real
# ones are a few hundred bytes (Celery cuts argsrepr and kwargsrepr to 1 KiB).
MAX_HEADERS_CHARS = 64 * 1024
MAX_NAME_CHARS = 255  # delivery tag, exchange, routing key, content type (AMQP's short strings)
LOGGED_BYTES = 200  # of a dropped message's start, in its log line

_lock = threading.Lock()
_dropped = 0
_listeners: list[Callable[[], None]] = []


def on_drop(listener: Callable[[], None]) -> None:
    """Call `listener` for every malformed message this process drops (the orchestrator counts them in Redis)."""
    _listeners.append(listener)


def dropped() -> int:
    """How many malformed messages this process dropped since it started."""
    return _dropped


def envelope_problem(payload: Any) -> str | None:
    """What is wrong with a decoded list item as a Kombu message, as far as Kombu itself reads it before Celery does
    (Message(), QoS.append) and as far as Celery would log it whole; None when nothing."""
    if not isinstance(payload, dict):
        return "not a JSON object"
    properties = payload.get("properties")
    if not isinstance(properties, dict):
        return "no properties object"
    info = properties.get("delivery_info")
    if not isinstance(info, dict):
        return "no delivery_info object"
    names = {
        "delivery_tag": properties.get("delivery_tag"),
        "exchange": info.get("exchange"),
        "routing_key": info.get("routing_key"),
    }
    for name, value in names.items():
        if not isinstance(value, str) or len(value) > MAX_NAME_CHARS:
            return f"{name} is not a short string"
    optional = {
        "body_encoding": properties.get("body_encoding"),
        "content-type": payload.get("content-type"),
        "content-encoding": payload.get("content-encoding"),
    }
    for name, value in optional.items():
        if value is not None and (not isinstance(value, str) or len(value) > MAX_NAME_CHARS):
            return f"{name} is not a short string"
    if payload.get("body") is not None and not isinstance(payload["body"], str):
        return "body is not a string"
    headers = payload.get("headers")
    if headers is not None and (not isinstance(headers, dict) or len(dumps(headers)) > MAX_HEADERS_CHARS):
        return f"headers are not an object of at most {MAX_HEADERS_CHARS} characters"
    return None


class Channel(kombu_redis.Channel):  # type: ignore[misc]  # Kombu ships no type information
    """Kombu's Redis channel with `_deliver_item` in place of `deliver(loads(item))` (see the module's doc), and
    publishes that may be sent in one pipeline (`batched_puts`)."""

    max_message_bytes = MAX_MESSAGE_BYTES
    from_transport_options = (*kombu_redis.Channel.from_transport_options, "max_message_bytes")
    _batch: list[tuple[str, str]] | None = None  # the messages of an open `batched_puts`: (list key, body)

    @contextmanager
    def batched_puts(self) -> Iterator[None]:
        """Messages published on this channel inside the block are sent when it ends, in one pipeline of LPUSHes (in
        their order), not one round trip each: a scheduler pass's launch orders are hundreds of messages, and on a
        busy machine each round trip waited for the broker's and the sender's turn on a core (2,442 orders of a
        first wave took 17.8 s). If the block raises, none is sent. The caller holds the channel for the block (a
        producer acquired from the pool is one thread's)."""
        self._batch = []
        try:
            yield
            if self._batch:
                with self.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
                    for key, body in self._batch:
                        pipe.lpush(key, body)
                    pipe.execute()
        finally:
            self._batch = None

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        if self._batch is None:
            super()._put(queue, message, **kwargs)
            return
        # The key and body as Kombu 5.5.4's _put makes them (UPSTREAM_PUT_SHA256), its LPUSH left to the batch.
        priority = self._get_message_priority(message, reverse=False)
        self._batch.append((self._q_for_pri(queue, priority), dumps(message)))

    def _brpop_read(self, **options: Any) -> bool:
        # Kombu 5.5.4's body (UPSTREAM_BRPOP_READ_SHA256), but for the line marked.
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                # if there's a ConnectionError, disconnect so the next
                # iteration will reconnect automatically.
                self.client.connection.disconnect()
                raise
            if dest__item:
                dest, item = dest__item
                dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]
                self._queue_cycle.rotate(dest)
                if self._deliver_item(item, dest):  # was: self.connection._deliver(loads(bytes_to_str(item)), dest)
                    return True
            raise Empty()
        finally:
            self._in_poll = None

    def _deliver_item(self, item: bytes, queue: str) -> bool:
        """Decode one popped item and hand it to the consumer; a malformed one is dropped (logged, counted) and
        False returned. Only a broken broker connection is raised (Celery reconnects)."""
        if len(item) > self.max_message_bytes:
            _drop(queue, item, f"larger than {self.max_message_bytes} bytes")
            return False
        try:
            payload = loads(bytes_to_str(item))
        except Exception as exc:  # JSON, UTF-8, nesting depth, Kombu's typed values ({"__type__": ...}): all junk
            _drop(queue, item, f"not JSON: {type(exc).__name__}: {str(exc)[:100]}")
            return False
        problem = envelope_problem(payload)
        if problem is not None:
            _drop(queue, item, problem)
            return False
        try:
            self.connection._deliver(payload, queue)
        except self.connection_errors:
            raise
        except Exception as exc:  # Celery's handler met something in it that it does not expect
            # It may be in the unacknowledged set already: removed, or it would be put back on the queue (at the
            # visibility timeout, or when this worker stops) and met again.
            self.qos.reject(payload["properties"]["delivery_tag"], requeue=False)
            _drop(queue, item, f"its delivery raised {type(exc).__name__}: {str(exc)[:100]}")
            return False
        return True


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel


def _drop(queue: str, item: bytes, why: str) -> None:
    global _dropped
    with _lock:
        _dropped += 1
        count = _dropped
    log.warning(
        "dropped a malformed message from queue %s (%d bytes: %s; %d dropped by this process): %r",
        queue,
        len(item),
        why,
        count,
        item[:LOGGED_BYTES],
    )
    for listener in _listeners:
        try:
            listener()
        except Exception:  # counting must never stop the consumer it counts for
            log.exception("a dropped-message listener failed")
