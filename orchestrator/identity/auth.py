"""Who sent an agent message: every message is sealed by its host (contracts/signing.py: host, time, nonce, name,
body, MAC under the host's key); anything else is refused, logged and counted, with the same answer for an unknown
host and a wrong MAC.

Celery messages (hello, heartbeat, task events) are also applied at most once: their nonce is remembered in Redis
(`remember`, after the handler succeeded) for as long as the message could pass the age check, and one seen before
is refused. Remembering only after success lets a handler that met an outage be retried, and a message a killed
worker had taken be redelivered; two copies handled at the very same moment are both applied, which every handler
tolerates (events are numbered, a heartbeat says the same thing twice). Stream entries skip the nonce check: their
age is measured to when Redis appended them, and one appended again is refused by its host's high-water mark
(orchestrator/identity/stream_marks.py), at one Redis round trip per run of entries instead of one per entry.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

import redis
from django.conf import settings

from contracts import signing
from orchestrator.identity import tokens
from orchestrator.models import Host
from orchestrator.plumbing import counters

log = logging.getLogger(__name__)
T = TypeVar("T")

REFUSED = "agent_messages_refused"
STALE = "agent_messages_stale"
REPLAYED = "agent_messages_replayed"
MALFORMED = "agent_messages_malformed"

_COUNTER = {
    signing.BAD_CREDENTIALS: REFUSED,
    signing.MISDIRECTED: REFUSED,
    signing.MALFORMED: REFUSED,
    signing.STALE: STALE,
    signing.REPLAYED: REPLAYED,
}
_NONCE_PREFIX = "tfdash:nonce:"

# (name, fresh) -> (host, its MAC key); (None, None) for an unknown name. `fresh`: not from a cache.
KeyLookup = Callable[[str, bool], tuple[Host | None, bytes | None]]


def host_and_key(name: str, fresh: bool = True) -> tuple[Host | None, bytes | None]:
    # order_by("pk"): Host's default ordering (cluster name, name) would join the cluster table on every message.
    host = Host.objects.filter(name=name).order_by("pk").first()
    return (host, tokens.mac_key(host)) if host is not None else (None, None)


@dataclass(frozen=True)
class Accepted:
    host: Host
    message: signing.Opened


@lru_cache(maxsize=1)
def _nonces() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)


def _nonce_key(message: signing.Opened) -> str:
    return f"{_NONCE_PREFIX}{message.host}:{message.nonce}"


def authenticate(
    payload: Any,
    name: str,
    *,
    key_of: KeyLookup = host_and_key,
    stream: bool = False,
    check_nonce: bool | None = None,
    now: float | None = None,
) -> Accepted | None:
    """The host a message `name` comes from and what it says, or None (logged and counted) when it cannot be
    trusted: not sealed by that host's key, outside the age bounds, or (Celery messages) seen before.
    `stream`: a metric stream entry (TFDASH_STREAM_MAX_AGE_S, no nonce check; see the module's doc). `check_nonce`
    False: the caller checks nonces itself (authenticate_batch, for many at once). `now`: the time the age is
    measured to (a stream entry's: when Redis appended it), by default this machine's clock now."""
    if check_nonce is None:
        check_nonce = not stream
    bounds = {
        "max_age_s": settings.TFDASH_STREAM_MAX_AGE_S if stream else settings.TFDASH_MESSAGE_MAX_AGE_S,
        "max_skew_s": settings.TFDASH_MESSAGE_MAX_SKEW_S,
        "max_chars": signing.MAX_SIGNED_CHARS if stream else signing.MAX_MESSAGE_CHARS,
        "now": now,
    }
    try:
        host_name = signing.envelope_host(payload)
        host, key = key_of(host_name, False)
        try:
            opened = signing.open_sealed(payload, key, name, **bounds)
        except signing.Refused as refused:
            if refused.reason != signing.BAD_CREDENTIALS or key_of is host_and_key:
                raise
            # A cached key that does not match is read again: a new token works at once.
            host, key = key_of(host_name, True)
            opened = signing.open_sealed(payload, key, name, **bounds)
        if check_nonce and _nonces().exists(_nonce_key(opened)):
            raise _replayed(opened)
    except signing.UnsupportedProtocol as refused:
        # Sealed by the host's own key: it is the host's agent, in a protocol this side does not speak.
        note_refused(name, refused)
        if host is not None:
            _note_protocol(host, None, refused.explain())
        return None
    except signing.Refused as refused:
        note_refused(name, refused)
        return None
    assert host is not None  # a key was found, so was its host
    _note_protocol(host, opened.protocol, "")
    return Accepted(host, opened)


def _note_protocol(host: Host, protocol: int | None, refusal: str) -> None:
    """Keep the host's row saying which protocol its agent speaks (None: leave it) and why its messages are refused
    (""): a write only when that changes, i.e. when its agent is upgraded or replaced."""
    fields: dict[str, Any] = {"agent_refusal": refusal[: Host._meta.get_field("agent_refusal").max_length]}
    if protocol is not None:
        fields["agent_protocol"] = protocol
    if all(getattr(host, field) == value for field, value in fields.items()):
        return
    Host.objects.filter(pk=host.pk).update(**fields)
    for field, value in fields.items():  # a cached row (the metric ingest's lookups) need not write it again
        setattr(host, field, value)
    if refusal:
        log.error("host %s: %s", host.name, refusal)


def _replayed(message: signing.Opened) -> signing.Refused:
    return signing.Refused(signing.REPLAYED, f"nonce {message.nonce[:16]} of {message.host!r} seen before")


def note_refused(name: str, refused: signing.Refused) -> None:
    """Log and count a message `name` that is not acted on."""
    # One line for an unknown host and a bad MAC alike: a probe learns nothing about which names exist.
    log.warning("agent message %s refused: %s", str(name)[:100], refused)
    counters.incr(_COUNTER.get(refused.reason, REFUSED))


def remember(accepted: Accepted) -> None:
    """Note a Celery message as handled: the same nonce is refused from now on, while it could still be fresh."""
    remember_all([accepted])


def remember_all(accepted: list[Accepted]) -> None:
    """`remember` for a batch, in one round trip."""
    window = max(1, math.ceil(settings.TFDASH_MESSAGE_MAX_AGE_S + settings.TFDASH_MESSAGE_MAX_SKEW_S))
    pipe = _nonces().pipeline(transaction=False)
    for one in accepted:
        pipe.set(_nonce_key(one.message), b"1", nx=True, ex=window)
    pipe.execute()


def authenticate_batch(payloads: list[Any], name: str) -> list[Accepted]:
    """`authenticate` (Celery bounds, nonce checked) for a batch of messages `name`: their hosts read in one query and
    their nonces checked in one round trip; what cannot be trusted is logged and counted as one by one, and a nonce
    met twice in the batch is refused the second time."""
    names = set()
    for payload in payloads:
        with contextlib.suppress(signing.Refused):  # refused (and counted) below, by authenticate
            names.add(signing.envelope_host(payload))
    # order_by("pk"): see host_and_key.
    hosts = {h.name: h for h in Host.objects.filter(name__in=names).order_by("pk")}
    keys: dict[str, bytes | None] = {}

    def key_of(host_name: str, _fresh: bool) -> tuple[Host | None, bytes | None]:
        host = hosts.get(host_name)
        if host is None:
            return None, None
        if host_name not in keys:
            keys[host_name] = tokens.mac_key(host)
        return host, keys[host_name]

    opened = [a for a in (authenticate(p, name, key_of=key_of, check_nonce=False) for p in payloads) if a]
    if not opened:
        return []
    pipe = _nonces().pipeline(transaction=False)
    for one in opened:
        pipe.exists(_nonce_key(one.message))
    seen = set()
    accepted = []
    for one, exists in zip(opened, pipe.execute(), strict=True):
        key = _nonce_key(one.message)
        if exists or key in seen:
            note_refused(name, _replayed(one.message))
            continue
        seen.add(key)
        accepted.append(one)
    return accepted


def authenticated_body(
    payload: Any, name: str, body_type: type[T], *, key_of: KeyLookup = host_and_key, stream: bool = False
) -> tuple[Accepted, T] | None:
    """The sender and the message body as `body_type`, or None (logged and counted) when either fails."""
    accepted = authenticate(payload, name, key_of=key_of, stream=stream)
    if accepted is None:
        return None
    try:
        return accepted, body_type(**accepted.message.body)
    except (KeyError, TypeError) as exc:
        log.warning("malformed %s from %s: %r", body_type.__name__, accepted.host.name, exc)
        counters.incr(MALFORMED)
        return None
