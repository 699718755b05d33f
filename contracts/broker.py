"""What a host may touch on the broker, one definition both sides read: its keys, its Redis user and its rights.

The anchor is Kubernetes' node authorizer: a kubelet's credential reaches only what is bound to its node. Here every
key a host's agent uses lives under `tfdash:host:<name>:` (its order queue and the keys Kombu keeps for it, and the
streams it adds its reports to), plus the one binding set Kombu keys by the queue's name; its Redis user may run only
the commands a Kombu consumer and `XADD` need, on those keys alone, with no pub/sub channel. So a host's credential
reads no other host's orders, writes no control-plane queue, cache, channel layer or nonce, and runs no admin command.

Per-host streams rather than shared ones: `XADD ... MAXLEN 0` is a write, and ACL rules cannot look at arguments, so
a host allowed to add to a shared stream could also empty it of every other host's entries. On its own streams it can
only harm itself.

The user's password is derived from the host's MAC key (contracts.signing.agent_mac_key, itself derived from the
agent token), so an agent needs its token and nothing else, and the control plane, which keeps that MAC key
encrypted, can set the user up again after Redis lost it (a restart without persistence) without storing a password.
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote, urlsplit, urlunsplit

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

USER_PREFIX = "host-"
_PASSWORD_INFO = b"tfdash broker password v1\x00"

# The streams a host adds to (see contracts/protocol.py for what travels on each).
HEARTBEATS = "heartbeats"  # its heartbeats: read by every orchestrator worker, in batches
EVENTS = "events"  # its hello and task events: applied by every orchestrator worker's reader as they come
METRICS = "metrics"  # metric points, log lines, host samples, artifacts: read by the ingest
STREAM_KINDS = (HEARTBEATS, EVENTS, METRICS)

# The commands a host's user may run: a Kombu consumer of one Redis list without acknowledgement emulation (BRPOP; the
# binding set; putting back what it had taken and not handled when it closes), XADD to its streams and XLEN of them (its
# metrics stream's backlog: contracts/metric_messages.py SHED_BACKLOG). No KEYS/SCAN/
# MONITOR/CLIENT (but SETINFO, which redis-py sends on connect)/CONFIG/FLUSH*/DEBUG/ACL, no PUBLISH/SUBSCRIBE, no
# EVAL/EVALSHA/FUNCTION, no stream reads or group commands.
AGENT_COMMANDS = (
    "ping", "select", "client|setinfo",
    "brpop", "lpush", "rpush", "llen", "exists", "multi", "exec", "discard",
    "sadd", "srem", "smembers",
    "xadd", "xlen",
)  # fmt: skip


def key_prefix(host: str) -> str:
    """Every key of `host`'s starts with this (host names are DNS labels: no glob character can occur in one)."""
    return f"tfdash:host:{host}:"


def order_queue(host: str) -> str:
    """The Celery queue `host`'s agent consumes; the control plane sends its orders there."""
    return f"{key_prefix(host)}orders"


def stream(host: str, kind: str) -> str:
    """The stream `host` adds entries of `kind` (HEARTBEATS, EVENTS, METRICS) to."""
    if kind not in STREAM_KINDS:
        raise ValueError(f"no stream kind {kind!r}")
    return f"{key_prefix(host)}{kind}"


def host_of_key(key: str | bytes) -> str:
    """The host a key of a host's belongs to (its order queue, its streams); "" for a key that is no host's."""
    text = key.decode(errors="replace") if isinstance(key, bytes) else key
    prefix, _, rest = text.partition("tfdash:host:")
    if prefix or ":" not in rest:
        return ""
    return rest.rsplit(":", 1)[0]


def transport_options(host: str) -> dict[str, object]:
    """Kombu's Redis transport options for `host`'s consumer. No acknowledgement emulation: with it Kombu keeps every
    consumer's unacknowledged messages in shared keys (`unacked`, its index) and takes a lock released by a Lua
    script, so the host's user would need EVALSHA (any script, run in Redis's single thread). Without it, a message
    the agent took and had not handled when it died is lost; every order may be lost anyway, and the control plane's
    convergence sends an unanswered order again (orchestrator/agents/reconcile.py)."""
    del host  # the queue's name carries the host's prefix; nothing else of Kombu's is kept in Redis
    return {"ack_emulation": False}


def username(host: str) -> str:
    return f"{USER_PREFIX}{host}"


def password(mac_key: bytes, host: str) -> str:
    """The host's broker password: HKDF-SHA256 of its MAC key, bound to its name and this use."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_PASSWORD_INFO + host.encode("utf-8"))
    return hkdf.derive(mac_key).hex()


def acl_rules(host: str, host_password: str, *, client_setinfo: bool = True) -> list[str]:
    """The `ACL SETUSER <username(host)>` arguments: from nothing (`reset`), on, the password's SHA-256 (what Redis
    keeps of it anyway), the host's keys, no channel, only AGENT_COMMANDS. `client_setinfo` False: for a Redis older
    than 7.2, which has no CLIENT SETINFO and refuses a rule naming it (redis-py then ignores the refusal it gets)."""
    prefix = key_prefix(host)
    digest = hashlib.sha256(host_password.encode("ascii")).hexdigest()
    return [
        "reset",
        "on",
        f"#{digest}",
        "resetchannels",
        f"~{prefix}*",
        # Kombu keeps the bindings of an exchange (named like the queue) in `_kombu.binding.<exchange>`.
        f"~_kombu.binding.{prefix}*",
        "-@all",
        *(f"+{command}" for command in AGENT_COMMANDS if client_setinfo or command != "client|setinfo"),
    ]


def without_credentials(url: str) -> str:
    """`url` with any user and password taken out: what may be shown, and the broker address an agent is given."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def server_url(server: str, host: str, host_password: str) -> str:
    """The broker URL `host`'s agent connects with: `server` (no credentials in it) signed in as the host's user."""
    parts = urlsplit(server)
    if parts.username or parts.password:
        raise ValueError(
            "the broker URL must carry no user or password: the agent signs in as its host's own user "
            "(derived from its token)"
        )
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"the broker URL must be redis:// or rediss://, not {parts.scheme or '(none)'}://")
    if not parts.hostname:
        raise ValueError("the broker URL names no host")
    netloc = f"{quote(username(host), safe='')}:{quote(host_password, safe='')}@{parts.netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
