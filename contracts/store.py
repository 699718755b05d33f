"""The object store's keys, the presigned URLs a launch order carries, and the checkpoint manifest: one definition,
read by the control plane (orchestrator/objectstore/store.py) and the agent (worker_agent/supervision/:
checkpoint_restore.py, checkpoint_upload.py, store_http.py).

Hosts never hold the store's credentials. The control plane presigns, per task, URLs for its own job's keys only:
- every task: GET of the checkpoint manifest and of both checkpoint slots (restored before it starts);
- the task whose checkpoint is authoritative (the chief, else worker 0): PUT of those three keys;
- every task: PUT of ARTIFACT_SLOTS keys of its own (`jobs/<job>/artifacts/<task>-<attempt>-<n>`).
A SigV4 URL names one method and one key: it is no use on another key (the signature covers the path), and it
expires (at most 7 days, SigV4's limit). A checkpoint is a tar in one of two slots, a.tar and b.tar: the agent
uploads into the slot the manifest does not name, then writes the manifest, so a half-uploaded tar is never named.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

# SigV4's own ceiling for a presigned URL's life.
MAX_PRESIGN_S = 7 * 24 * 3600
# What one PUT may carry (S3's single-request limit): the cap of a store-backed artifact and of a checkpoint tar.
MAX_STORE_OBJECT_BYTES = 5 * 1024**3
MAX_STORE_ARTIFACT_BYTES = MAX_STORE_OBJECT_BYTES
MAX_CHECKPOINT_BYTES = MAX_STORE_OBJECT_BYTES
MAX_MANIFEST_BYTES = 4096
ARTIFACT_SLOTS = 4  # artifact keys per task attempt (the model, the TensorBoard archive, two of the script's own)
MAX_URL_CHARS = 4096
SLOTS = ("a", "b")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def checkpoint_key(job_id: int, name: str) -> str:
    """`name`: "a.tar", "b.tar" or "manifest.json"."""
    return f"jobs/{int(job_id)}/checkpoints/{name}"


def manifest_key(job_id: int) -> str:
    return checkpoint_key(job_id, "manifest.json")


def slot_key(job_id: int, slot: str) -> str:
    if slot not in SLOTS:
        raise ValueError(f"no checkpoint slot {slot!r}")
    return checkpoint_key(job_id, f"{slot}.tar")


def artifact_key(job_id: int, task_id: int, attempt: int, slot: int) -> str:
    if not 0 <= slot < ARTIFACT_SLOTS:
        raise ValueError(f"no artifact slot {slot}")
    return f"jobs/{int(job_id)}/artifacts/{int(task_id)}-{int(attempt)}-{slot}"


@dataclass(frozen=True)
class StoreUrls:
    """What a launch order carries about the store (LaunchSpec.store, as a dict); all URLs presigned."""

    manifest_get: str
    slot_get: dict[str, str]  # "a"/"b" -> GET URL
    # Only for the task whose checkpoint is authoritative; empty elsewhere.
    manifest_put: str = ""
    slot_put: dict[str, str] = field(default_factory=dict)
    artifact_put: list[str] = field(default_factory=list)  # slot n -> PUT URL

    @property
    def uploads_checkpoints(self) -> bool:
        return bool(self.manifest_put) and set(self.slot_put) == set(SLOTS)


def store_urls_from(raw: Any) -> StoreUrls | None:
    """The StoreUrls of an order's `store` field; None when there is none; ValueError when it is malformed."""
    if not raw:
        return None
    if not isinstance(raw, dict):
        raise ValueError("store: not an object")
    try:
        urls = StoreUrls(
            manifest_get=_url(raw["manifest_get"]),
            slot_get={slot: _url(raw["slot_get"][slot]) for slot in SLOTS},
            manifest_put=_url(raw.get("manifest_put", ""), blank=True),
            slot_put={slot: _url(url) for slot, url in _slots(raw.get("slot_put", {})).items()},
            artifact_put=[_url(url) for url in _list(raw.get("artifact_put", []))][:ARTIFACT_SLOTS],
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"store: malformed ({exc!r})") from None
    return urls


def _slots(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict) or not set(raw) <= set(SLOTS):
        raise ValueError("store: slot_put names unknown slots")
    return raw


def _list(raw: Any) -> list[Any]:
    if not isinstance(raw, list):
        raise ValueError("store: artifact_put is not a list")
    return raw


def _url(value: Any, *, blank: bool = False) -> str:
    if blank and value == "":
        return ""
    if not isinstance(value, str) or len(value) > MAX_URL_CHARS:
        raise ValueError("store: a URL is not a string of at most MAX_URL_CHARS")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("store: a URL is not http(s)")
    return value


def shown(url: str) -> str:
    """A presigned URL as it may be logged: scheme, host and path, never its query (the signature and credential)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


@dataclass(frozen=True)
class Manifest:
    """Which slot holds the last complete checkpoint: written after that slot's tar is fully uploaded."""

    slot: str
    sha256: str
    size: int
    epoch: int | None = None  # the checkpoint's number (TensorFlow's ckpt-N), when the index names one
    saved_at: float = 0.0

    def to_bytes(self) -> bytes:
        body = {"slot": self.slot, "sha256": self.sha256, "size": self.size, "epoch": self.epoch}
        return json.dumps({**body, "saved_at": self.saved_at}, separators=(",", ":")).encode()


def manifest_from(raw: bytes) -> Manifest:
    """ValueError when `raw` is not a manifest tfdash writes."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ValueError("manifest too large")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"manifest is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("manifest is not an object")
    slot, sha, size, epoch = obj.get("slot"), obj.get("sha256"), obj.get("size"), obj.get("epoch")
    if slot not in SLOTS or not isinstance(sha, str) or not _SHA256.match(sha):
        raise ValueError("manifest names no slot or no SHA-256")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_CHECKPOINT_BYTES:
        raise ValueError("manifest's size is out of bounds")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0):
        raise ValueError("manifest's epoch is not a count")
    saved_at = obj.get("saved_at", 0.0)
    return Manifest(str(slot), sha, size, epoch, float(saved_at) if isinstance(saved_at, int | float) else 0.0)


def other_slot(slot: str | None) -> str:
    return "b" if slot == "a" else "a"
