"""The control plane's keys: the Ed25519 private key that signs every order to an agent, and, derived from it, the key
that encrypts each host's message MAC key at rest.

The private key comes from the file named by TFDASH_CONTROL_KEY_FILE, else from TFDASH_CONTROL_KEY (PEM or base64 of
the raw 32 bytes); `make run` generates one under var/ (mode 0600). It is never stored in the database, so a dump of
the database can neither sign an order nor decrypt the host keys (AES-GCM, the host's name as associated data, so a
key copied onto another host's row does not open) and so cannot forge an agent's messages either.
"""

from __future__ import annotations

import base64
import os
from functools import lru_cache

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from contracts.signing import load_private_key, public_key_text

_AT_REST_INFO = b"tfdash host MAC keys at rest v1"


@lru_cache(maxsize=1)
def control_private_key() -> Ed25519PrivateKey:
    path, text = settings.TFDASH_CONTROL_KEY_FILE, settings.TFDASH_CONTROL_KEY
    try:
        if path:
            with open(path, encoding="ascii") as handle:
                text = handle.read()
        if not text:
            raise ValueError("set TFDASH_CONTROL_KEY_FILE (a file holding it) or TFDASH_CONTROL_KEY")
        return load_private_key(text)
    except (OSError, ValueError) as exc:
        raise ImproperlyConfigured(f"no usable control-plane signing key: {exc}") from exc


def control_public_key() -> str:
    """What every agent pins (`--control-key`): base64 of the raw public key."""
    return public_key_text(control_private_key().public_key())


@lru_cache(maxsize=1)
def _at_rest() -> AESGCM:
    raw = control_private_key().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return AESGCM(HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_AT_REST_INFO).derive(raw))


def seal_host_key(host: str, key: bytes) -> str:
    nonce = os.urandom(12)
    return base64.b64encode(nonce + _at_rest().encrypt(nonce, key, host.encode("utf-8"))).decode("ascii")


def open_host_key(host: str, sealed: str) -> bytes | None:
    """The host's MAC key, or None when there is none or it does not open (another control key, another host)."""
    try:
        raw = base64.b64decode(sealed, validate=True)
        return _at_rest().decrypt(raw[:12], raw[12:], host.encode("utf-8")) if len(raw) > 12 else None
    except (InvalidTag, ValueError):
        return None


def forget() -> None:
    """Read the key again on next use (tests that swap it)."""
    control_private_key.cache_clear()
    _at_rest.cache_clear()
