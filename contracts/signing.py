"""How messages are authenticated on the wire, both ways (part of the protocol; see contracts/protocol.py).

Agent -> orchestrator (`seal`, `open_sealed`): no token travels. Each message carries its host, a timestamp, a random
nonce, its name (the Celery task or stream report it is) and its body, all inside `signed`, a JSON text; `mac` is
HMAC-SHA256 over exactly those bytes under the host's MAC key, which HKDF derives from the agent token, bound to the
host's name and to this purpose (`agent_mac_key`). The orchestrator keeps that derived key (encrypted at rest), never
the token. Signing a text rather than a re-serialised object means both sides MAC the same bytes, whatever a
transport does to key order or number formats.

Orchestrator -> agent (`sign_order`, `open_order`): orders are signed with the control plane's Ed25519 private key;
an agent pins the matching public key given at registration. The envelope carries a random order id, the host it is
for, when it was issued, its kind and its body. The agent refuses an order that is unsigned, badly signed, for
another host or another kind, outside the freshness window, or already seen (worker_agent/seen_orders.py).

Freshness, on the receiver's clock: a message is accepted from `ts - max_skew` up to `ts + max_age`. The bounds are
arguments: the orchestrator's are settings (config/settings.py), the agent's ORDER_MAX_AGE_S and MAX_CLOCK_SKEW_S.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives import hmac as crypto_hmac
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from contracts.limits import MAX_ARTIFACT_BYTES

# Version of the wire these envelopes are (contracts.protocol.PROTOCOL_VERSION re-exports it). 4: an agent reports the
# task environments of its host, and a launch spec may name one (contracts/task_messages.py LAUNCH_KEYS_SINCE).
WIRE_VERSION = 4
# The oldest protocol the control plane accepts from agents: one behind, so a fleet is upgraded control plane first,
# then host by host, with jobs running throughout (docs/upgrade.md). Orders to such a host are signed with its own
# protocol and carry only what it knows (`sign_order(protocol=...)`, contracts/task_messages.py `launch_body_for`).
MIN_AGENT_PROTOCOL = 3

# An order older than this (agent's clock) is refused: held in the broker while the agent was down, or captured and
# replayed. Convergence resends an unanswered order as a fresh one every TFDASH_ORDER_RESEND_S (10 s by default), so
# a refused stale order costs a short delay, never a lost launch or kill.
ORDER_MAX_AGE_S = 60.0
# How far ahead of the receiver's clock a timestamp may be (clocks of two machines disagree a little; NTP keeps them
# well within this).
MAX_CLOCK_SKEW_S = 30.0

_SALT = b"tfdash agent-mac v3"
_PURPOSE = b"agent->orchestrator message MAC"
NONCE_BYTES = 16
# An artifact is the largest report: its file (at most MAX_ARTIFACT_BYTES) as base64, and room for the rest. (64 MiB
# flat let no artifact over ~48 MiB through: its entry was dead-lettered unread, and the job never heard why.)
MAX_SIGNED_CHARS = 4 * -(-MAX_ARTIFACT_BYTES // 3) + 1024 * 1024
# A hello, heartbeat or task event: a report of MAX_REPORTED_RUNNING tasks and MAX_REPORTED_EXITS exits is a few
# hundred KB. A larger one is refused before it is parsed, so a host cannot make the orchestrator build a structure of
# the size it claims (a million GPUs in its facts parse to hundreds of MB).
MAX_MESSAGE_CHARS = 1024 * 1024


class Refused(ValueError):
    """A message that must not be acted on; `reason` is one of the REASON_* values (for counting)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# Why a message was refused. BAD_CREDENTIALS covers an unknown host and a wrong MAC alike (a prober learns nothing).
BAD_CREDENTIALS = "bad credentials"
MALFORMED = "malformed"
STALE = "stale"
REPLAYED = "replayed"
MISDIRECTED = "misdirected"
# Sealed by the host's key (the MAC was checked), but in a protocol this side does not speak: the agent is too old
# (or newer than the control plane). Told apart so the host's page can say so (UnsupportedProtocol.explain).
UNSUPPORTED_PROTOCOL = "unsupported protocol"


class UnsupportedProtocol(Refused):
    """A genuine message of a protocol outside MIN_AGENT_PROTOCOL..WIRE_VERSION; `explain()` is what staff read."""

    def __init__(self, host: str, protocol: Any) -> None:
        super().__init__(UNSUPPORTED_PROTOCOL, f"{host!r} speaks protocol {protocol!r}")
        self.protocol = protocol

    def explain(self) -> str:
        accepted = f"this control plane accepts protocols {MIN_AGENT_PROTOCOL} to {WIRE_VERSION}"
        if type(self.protocol) is int and self.protocol > WIRE_VERSION:
            return (
                f"The agent speaks protocol {str(self.protocol)[:20]}, newer than this control plane ({accepted}): "
                "upgrade the control plane first (docs/upgrade.md)."
            )
        return (
            f"The agent speaks protocol {str(self.protocol)[:20]}, too old ({accepted}): its messages are refused "
            "until it is upgraded and restarted (docs/upgrade.md)."
        )


def agent_mac_key(token: str, host: str) -> bytes:
    """The key an agent's messages are MACed with: HKDF-SHA256 of its token, bound to the host's name and this use.
    One-way: the key does not give the token back, and a token for another host gives another key."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=_PURPOSE + b"\x00" + host.encode("utf-8"))
    return hkdf.derive(token.encode("utf-8"))


def _mac(key: bytes, data: bytes) -> bytes:
    mac = crypto_hmac.HMAC(key, hashes.SHA256())
    mac.update(data)
    return mac.finalize()


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def seal(
    key: bytes, host: str, name: str, body: Any, *, now: float | None = None, protocol: int = WIRE_VERSION
) -> dict[str, Any]:
    """An agent -> orchestrator envelope for `body` (JSON-able) as message `name` (`protocol`: tests play older
    agents with it)."""
    signed = _dumps(
        {
            "protocol": protocol,
            "host": host,
            "name": name,
            "ts": time.time() if now is None else now,
            "nonce": secrets.token_hex(NONCE_BYTES),
            "body": body,
        }
    )
    return {"host": host, "signed": signed, "mac": _mac(key, signed.encode("utf-8")).hex()}


def envelope_host(envelope: Any) -> str:
    """The host an envelope claims to come from (unverified), for finding its key; Refused when there is none."""
    if not isinstance(envelope, dict) or not isinstance(envelope.get("host"), str) or not envelope["host"]:
        raise Refused(MALFORMED, "not an agent envelope")
    return str(envelope["host"])[:100]


@dataclass(frozen=True)
class Opened:
    host: str
    name: str
    ts: float
    nonce: str
    body: Any
    protocol: int = WIRE_VERSION


def open_sealed(
    envelope: Any,
    key: bytes | None,
    name: str,
    *,
    max_age_s: float,
    max_skew_s: float = MAX_CLOCK_SKEW_S,
    now: float | None = None,
    max_chars: int = MAX_SIGNED_CHARS,
) -> Opened:
    """The verified content of an envelope sealed under `key` (None: the host is unknown) as message `name`, or
    Refused (UnsupportedProtocol: a genuine message of a protocol outside MIN_AGENT_PROTOCOL..WIRE_VERSION). The MAC
    is checked before anything inside `signed` is read."""
    host = envelope_host(envelope)
    signed, mac = envelope.get("signed"), envelope.get("mac")
    if not isinstance(signed, str) or not isinstance(mac, str):
        raise Refused(MALFORMED, "not an agent envelope")
    if len(signed) > max_chars:
        raise Refused(MALFORMED, f"from {host!r}: {len(signed)} characters, more than {max_chars}")
    try:
        given = bytes.fromhex(mac)
    except ValueError:
        given = b""
    if key is None or not secrets.compare_digest(given, _mac(key, signed.encode("utf-8"))):
        raise Refused(BAD_CREDENTIALS, f"host {host!r}")
    try:
        content = json.loads(signed)
        opened = Opened(
            host=content["host"], name=content["name"], ts=float(content["ts"]), nonce=content["nonce"],
            body=content["body"], protocol=content["protocol"],
        )  # fmt: skip
    except (ValueError, TypeError, KeyError) as exc:
        raise Refused(MALFORMED, f"from {host!r}: {exc!r}") from exc
    if type(opened.protocol) is not int or not MIN_AGENT_PROTOCOL <= opened.protocol <= WIRE_VERSION:
        raise UnsupportedProtocol(host, opened.protocol)
    if opened.host != host or opened.name != name:
        raise Refused(MISDIRECTED, f"{opened.name!r} of {opened.host!r} presented as {name!r} of {host!r}")
    if not isinstance(opened.nonce, str) or not 16 <= len(opened.nonce) <= 64:
        raise Refused(MALFORMED, f"from {host!r}: no nonce")
    check_fresh(opened.ts, max_age_s=max_age_s, max_skew_s=max_skew_s, now=now)
    return opened


def check_fresh(ts: float, *, max_age_s: float, max_skew_s: float = MAX_CLOCK_SKEW_S, now: float | None = None) -> None:
    """Refused unless `ts` lies within [now - max_age_s, now + max_skew_s] (nan and infinities are refused too)."""
    now = time.time() if now is None else now
    if not now - max_age_s <= ts <= now + max_skew_s:
        raise Refused(STALE, f"{now - ts:.1f} s old (accepted: {-max_skew_s:g} to {max_age_s:g})")


# --- orders: orchestrator -> agent ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Order:
    order_id: str
    host: str
    kind: str
    issued_at: float
    body: dict[str, Any]


def sign_order(
    private_key: Ed25519PrivateKey,
    host: str,
    kind: str,
    body: dict[str, Any],
    *,
    now: float | None = None,
    protocol: int = WIRE_VERSION,
) -> dict[str, Any]:
    """An order for `host`'s agent, signed by the control plane (`now`: when it is issued, by default now), in the
    `protocol` its agent speaks (an agent refuses an order of any other: the body must be one it knows too)."""
    text = _dumps(
        {
            "protocol": protocol,
            "id": secrets.token_hex(NONCE_BYTES),
            "host": host,
            "kind": kind,
            "issued_at": time.time() if now is None else now,
            "body": body,
        }
    )
    return {"order": text, "sig": base64.b64encode(private_key.sign(text.encode("utf-8"))).decode("ascii")}


def open_order(
    message: Any,
    public_key: Ed25519PublicKey,
    host: str,
    kind: str,
    *,
    max_age_s: float = ORDER_MAX_AGE_S,
    max_skew_s: float = MAX_CLOCK_SKEW_S,
    now: float | None = None,
) -> Order:
    """The verified order, or Refused: unsigned, badly signed, for another host or kind, or outside the window.
    Whether it was seen before is the caller's to check (it keeps the seen ids)."""
    if not isinstance(message, dict) or not isinstance(message.get("order"), str) or not message.get("sig"):
        raise Refused(MALFORMED, "unsigned")
    text = message["order"]
    try:
        public_key.verify(base64.b64decode(str(message["sig"]), validate=True), text.encode("utf-8"))
    except (InvalidSignature, binascii.Error, ValueError) as exc:
        raise Refused(BAD_CREDENTIALS, "bad signature") from exc
    try:
        content = json.loads(text)
        order = Order(
            order_id=str(content["id"]), host=content["host"], kind=content["kind"],
            issued_at=float(content["issued_at"]), body=content["body"],
        )  # fmt: skip
        protocol = content["protocol"]
    except (ValueError, TypeError, KeyError) as exc:
        raise Refused(MALFORMED, repr(exc)) from exc
    if protocol != WIRE_VERSION or not isinstance(order.body, dict):
        raise Refused(MALFORMED, f"protocol {protocol!r}")
    if order.host != host or order.kind != kind:
        raise Refused(MISDIRECTED, f"a {order.kind!r} order for {order.host!r} delivered as {kind!r} to {host!r}")
    check_fresh(order.issued_at, max_age_s=max_age_s, max_skew_s=max_skew_s, now=now)
    return order


# --- key formats ---------------------------------------------------------------------------------------------------
def public_key_text(key: Ed25519PublicKey) -> str:
    """The form an agent is given (`--control-key`): base64 of the raw 32 bytes."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def load_public_key(text: str) -> Ed25519PublicKey:
    """A public key as `public_key_text` writes it, or PEM; ValueError otherwise."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        key = serialization.load_pem_public_key(text.encode("ascii"))
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("not an Ed25519 public key")
        return key
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not a base64 Ed25519 public key (32 bytes)") from exc


def private_key_text(key: Ed25519PrivateKey) -> str:
    """PEM (PKCS#8, unencrypted: the file's mode protects it)."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode("ascii")


def load_private_key(text: str) -> Ed25519PrivateKey:
    """A private key as PEM (PKCS#8) or base64 of the raw 32 bytes; ValueError otherwise."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        key = serialization.load_pem_private_key(text.encode("ascii"), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("not an Ed25519 private key")
        return key
    try:
        return Ed25519PrivateKey.from_private_bytes(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not an Ed25519 private key (PEM, or base64 of 32 bytes)") from exc
