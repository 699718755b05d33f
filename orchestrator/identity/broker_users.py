"""Each host's own Redis user (contracts/broker.py says what it may touch), kept in step with the hosts table.

Level-triggered, like a Kubernetes controller: `sync` compares the users Redis has with the hosts the database has and
fixes the difference (a host without its user, a user whose rules or password changed, a user whose host is gone). It
runs when an orchestrator worker starts, every SYNC_EVERY_S from the watchdog, and at the watchdog's next tick when
Redis has lost users it was given (a restart without them), so a registration whose `apply` met a Redis outage or a
host deleted while Redis was away converge within seconds. Issuing a token and deleting a host also act at once
(`apply_quietly`, `remove_quietly`, after commit), and close the user's open connections: the old password stops
working on connections already made too.

What was applied is remembered in one control-plane hash (user -> digest of its rules), so the watchdog's check costs
two commands (`ACL USERS`, `HKEYS`) whatever the fleet's size. The password is never stored: it is derived from the
host's MAC key, which the database keeps encrypted (orchestrator/identity/keys.py).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from functools import lru_cache

import redis
from django.conf import settings

from contracts import broker
from orchestrator.identity import keys
from orchestrator.models import Host

log = logging.getLogger(__name__)

APPLIED = "tfdash:broker-users"  # user -> sha256 of the rules last applied (control plane only)
SYNC_EVERY_S = 10.0


@lru_cache(maxsize=1)
def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)


def agent_server_url() -> str:
    """The broker address an agent is given: TFDASH_AGENT_SERVER_URL when set (hosts reach Redis under another name),
    else the control plane's REDIS_URL, either with any user and password taken out: those are the control plane's
    own, and an agent signs in as its host's user."""
    return broker.without_credentials(settings.TFDASH_AGENT_SERVER_URL or settings.REDIS_URL)


def host_password(host: Host) -> str | None:
    """The host's broker password (contracts/broker.py), None while it has no token (or its key does not open)."""
    key = keys.open_host_key(host.name, host.agent_key) if host.agent_key else None
    return broker.password(key, host.name) if key is not None else None


def _digest(rules: list[str]) -> str:
    return hashlib.sha256("\x00".join(rules).encode()).hexdigest()


def rules_for(client: redis.Redis, name: str, password: str) -> list[str]:
    """The host's rules as this Redis takes them: without CLIENT SETINFO on a Redis older than 7.2."""
    return broker.acl_rules(name, password, client_setinfo=_knows_client_setinfo(client))


def _knows_client_setinfo(client: redis.Redis) -> bool:
    key = id(client.connection_pool)
    if key not in _setinfo_known:
        try:
            client.execute_command("ACL", "DRYRUN", "default", "CLIENT", "SETINFO", "LIB-NAME", "x")
            _setinfo_known[key] = True
        except redis.ResponseError as exc:
            # "Command 'client|setinfo' not found" (Redis 7.0/7.1); a refusal for `default` still means it exists.
            _setinfo_known[key] = "not found" not in str(exc).lower() and "unknown" not in str(exc).lower()
    return _setinfo_known[key]


_setinfo_known: dict[int, bool] = {}


def _set_user(client: redis.Redis, name: str, rules: list[str], *, disconnect: bool) -> None:
    user = broker.username(name)
    client.execute_command("ACL", "SETUSER", user, *rules)
    client.hset(APPLIED, user, _digest(rules))
    if disconnect:
        # SETUSER leaves connections made with the old password open: close them, the agent signs in again.
        client.execute_command("CLIENT", "KILL", "USER", user)


def _delete_user(client: redis.Redis, user: str) -> None:
    client.execute_command("ACL", "DELUSER", user)  # also closes its connections
    client.hdel(APPLIED, user)


def apply(name: str, client: redis.Redis | None = None, using: str | None = None) -> bool:
    """Set the broker user of host `name` from its row (a new password after a new token), closing its connections;
    remove the user when the host is gone or has no token. Returns whether the host has a user now."""
    client = client or _client()
    host = Host.objects.using(using).filter(name=name).first()
    password = host_password(host) if host is not None else None
    if password is None:
        _delete_user(client, broker.username(name))
        return False
    _set_user(client, name, rules_for(client, name, password), disconnect=True)
    log.info("broker user %s set", broker.username(name))
    return True


def apply_quietly(name: str, using: str | None = None) -> None:
    """`apply` after a commit: a Redis outage is logged, and the next `sync` does it."""
    try:
        apply(name, using=using)
    except redis.RedisError as exc:
        log.warning("could not set the broker user of host %s now (the next sync will): %s", name, exc)


def remove_quietly(name: str) -> None:
    try:
        _delete_user(_client(), broker.username(name))
    except redis.RedisError as exc:
        log.warning("could not remove the broker user of host %s now (the next sync will): %s", name, exc)


@dataclass
class Synced:
    set: int = 0
    removed: int = 0
    wanted: int = 0  # hosts that have a user now


def sync(client: redis.Redis | None = None) -> Synced:
    """Make Redis's host users match the hosts table (see the module's doc)."""
    client = client or _client()
    present = {_text(u) for u in client.execute_command("ACL", "USERS")}
    applied = {_text(k): _text(v) for k, v in client.hgetall(APPLIED).items()}
    done = Synced()
    wanted: set[str] = set()
    for host in Host.objects.exclude(agent_key="").only("name", "agent_key").order_by("pk"):
        password = host_password(host)
        if password is None:
            continue
        user = broker.username(host.name)
        wanted.add(user)
        rules = rules_for(client, host.name, password)
        if user not in present or applied.get(user) != _digest(rules):
            _set_user(client, host.name, rules, disconnect=user in present)
            done.set += 1
    stale = [user for user in present if user.startswith(broker.USER_PREFIX) and user not in wanted]
    if stale:
        # Read again just before deleting: a host registered while this sync ran (its row committed after the read
        # above, its user set at once after that commit) keeps the user it was just given. Without this, a host
        # deleted and registered again under the same name could lose its user until the next sync.
        names = [user.removeprefix(broker.USER_PREFIX) for user in stale]
        registered = set(Host.objects.filter(name__in=names).exclude(agent_key="").values_list("name", flat=True))
        for user in stale:
            if user.removeprefix(broker.USER_PREFIX) not in registered:
                _delete_user(client, user)
                done.removed += 1
    for user in set(applied) - present - wanted:
        client.hdel(APPLIED, user)
    done.wanted = len(wanted)
    if done.set or done.removed:
        log.info("broker users: %d set, %d removed", done.set, done.removed)
    return done


_last_sync = 0.0
_last_wanted = 0


def sync_now_and_then(client: redis.Redis | None = None) -> None:
    """The watchdog's tick: a full `sync` every SYNC_EVERY_S, and at once when Redis has lost users it was given (a
    restart without them: what was applied is missing, or the record of it is gone with everything else). The check
    costs two commands; a full sync reads every host's key. A Redis error waits for the next tick."""
    global _last_sync, _last_wanted
    client = client or _client()
    try:
        due = time.monotonic() - _last_sync >= SYNC_EVERY_S
        if not due:
            present = {_text(u) for u in client.execute_command("ACL", "USERS")}
            applied = {_text(u) for u in client.hkeys(APPLIED)}
            due = not applied <= present or len(applied) < _last_wanted
        if due:
            _last_sync = time.monotonic()
            done = sync(client)
            _last_wanted = done.wanted
    except redis.RedisError as exc:
        log.warning("broker users not synced: %s", exc)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
