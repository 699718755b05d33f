"""Restoring a job's checkpoint from the object store, before a task starts (first start, restart, resume).

GET the manifest; when there is one, GET the slot it names, check its size and SHA-256, and unpack it as the job
folder's checkpoints/ (only regular files and folders, no absolute path, no `..`; made in a fresh 0700 folder of the
agent's, handed to the job's uid, then renamed into place). A tar the manifest does not name (a half-finished upload)
is never read. One restore per (job, attempt) on a host (`Restores`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import tarfile
import threading
from pathlib import Path, PurePosixPath

from contracts.store import MAX_CHECKPOINT_BYTES, MAX_MANIFEST_BYTES, Manifest, StoreUrls, manifest_from
from worker_agent import folders
from worker_agent.folders import Place
from worker_agent.supervision.store_http import CHUNK, StoreError, http_get

log = logging.getLogger(__name__)

MAX_MEMBERS = 10_000
MAX_DEPTH = 16
CHECKPOINTS = "checkpoints"


def read_manifest(urls: StoreUrls) -> Manifest | None:
    """The store's manifest, None when there is none (a new job). StoreError when it cannot be read or is junk."""
    buffer = _Buffer()
    status, _, _ = http_get(urls.manifest_get, buffer, MAX_MANIFEST_BYTES)
    if status == 404:
        return None
    if status // 100 != 2:
        raise StoreError(f"manifest: the store answered {status}")
    try:
        return manifest_from(bytes(buffer.data))
    except ValueError as exc:
        raise StoreError(f"manifest refused: {exc}") from None


class _Buffer:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, chunk: bytes) -> int:
        self.data += chunk
        return len(chunk)


def restore(urls: StoreUrls, job_dir: Place, uid: int | None, scratch: Path) -> Manifest | None:
    """Make the job folder's checkpoints/ the store's last complete checkpoint (see the module's docstring); the
    manifest restored, or None when the store has none (the folder is left as it is). StoreError otherwise."""
    manifest = read_manifest(urls)
    if manifest is None:
        return None
    scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
    archive = scratch / f"restore-{secrets.token_hex(6)}.tar"
    try:
        with open(archive, "xb") as out:
            os.chmod(archive, 0o600)
            status, size, digest = http_get(urls.slot_get[manifest.slot], out, MAX_CHECKPOINT_BYTES)
        if status // 100 != 2:
            raise StoreError(f"slot {manifest.slot}: the store answered {status}")
        if (size, digest) != (manifest.size, manifest.sha256):
            raise StoreError(f"slot {manifest.slot} does not match its manifest (size {size}, sha256 {digest[:12]})")
        _unpack_into(archive, job_dir, uid)
    finally:
        archive.unlink(missing_ok=True)
    return manifest


class Restores:
    """One restore per (job, attempt) on this host, before its first task here starts: its other tasks here share the
    job folder, and one of them may already be running on what was restored."""

    KEEP = 1_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[tuple[int, int], str | None] = {}  # -> the slot the manifest named

    def once(
        self, job_id: int, attempt: int, urls: StoreUrls, job_dir: Place, uid: int | None, scratch: Path
    ) -> str | None:
        key = (job_id, attempt)
        with self._lock:
            if key in self._done:
                return self._done[key]
            manifest = restore(urls, job_dir, uid, scratch)
            if manifest is not None:
                log.info(
                    "job %s attempt %s: checkpoint %s restored from the store (slot %s, %d bytes)",
                    job_id, attempt, manifest.epoch, manifest.slot, manifest.size,
                )  # fmt: skip
            self._done[key] = manifest.slot if manifest is not None else None
            while len(self._done) > self.KEEP:
                del self._done[next(iter(self._done))]
            return self._done[key]


def _unpack_into(archive: Path, job_dir: Place, uid: int | None) -> None:
    parent = folders.open_folder(job_dir, create=True)
    fresh = f".restore-{secrets.token_hex(6)}"
    try:
        os.mkdir(fresh, 0o700, dir_fd=parent)
        try:
            fd = os.open(fresh, folders.DIR_FLAGS, dir_fd=parent)
            try:
                extract_plain(archive, fd)
                if uid is not None:
                    folders.chown_tree(fd, uid)
                    os.fchown(fd, uid, uid)
            finally:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(CHECKPOINTS, dir_fd=parent)
            os.rename(fresh, CHECKPOINTS, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                shutil.rmtree(fresh, dir_fd=parent)
            raise
    finally:
        os.close(parent)


def member_problem(member: tarfile.TarInfo) -> str:
    """Why a tar member may not be unpacked, or ""."""
    if not (member.isreg() or member.isdir()):
        return "not a regular file or folder"
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts or not path.parts or "\x00" in member.name:
        return "not a plain relative path"
    if len(path.parts) > MAX_DEPTH:
        return "too deep"
    return ""


def extract_plain(archive: Path, into_fd: int) -> None:
    """Unpack `archive` under the (fresh, the agent's own) folder `into_fd`: regular files and folders only; StoreError
    at the first member that is anything else, or past the bounds."""
    total = 0
    with tarfile.open(archive, "r:") as tar:
        for count, member in enumerate(tar):
            problem = member_problem(member)
            if problem or count >= MAX_MEMBERS:
                raise StoreError(f"checkpoint tar member {member.name[:200]!r}: {problem or 'too many members'}")
            total += member.size
            if total > MAX_CHECKPOINT_BYTES:
                raise StoreError("checkpoint tar unpacks past its bound")
            parts = PurePosixPath(member.name).parts
            where = _folder(into_fd, parts if member.isdir() else parts[:-1])
            try:
                if member.isreg():
                    source = tar.extractfile(member)
                    assert source is not None
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                    out = os.open(parts[-1], flags, 0o600, dir_fd=where)
                    with os.fdopen(out, "wb") as handle:
                        shutil.copyfileobj(source, handle, CHUNK)
            finally:
                if where != into_fd:
                    os.close(where)


def _folder(root: int, parts: tuple[str, ...]) -> int:
    fd = root
    for name in parts:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=fd)
        child = os.open(name, folders.DIR_FLAGS, dir_fd=fd)
        if fd != root:
            os.close(fd)
        fd = child
    return fd
