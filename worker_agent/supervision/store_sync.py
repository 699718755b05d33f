"""Checkpoints and artifacts through the cluster's object store, with the presigned URLs of a launch order
(contracts/store.py): this host holds no credential of the store, and its URLs reach its own job's keys only.

- Restore, before a task starts (first start, restart, resume): GET the manifest; when there is one, GET the slot
  it names, check its size and SHA-256, and unpack it as the job folder's checkpoints/ (only regular files and
  folders, no absolute path, no `..`; made in a fresh 0700 folder of the agent's, handed to the job's uid, then
  renamed into place). A tar the manifest does not name (a half-finished upload) is never read.
- Upload, while the authoritative task runs (the chief, else worker 0): when the checkpoint index files under
  checkpoints/ (TensorFlow's `checkpoint`, written after the data files) change, the files each index names are
  packed (read by fd, never through a link, the task's own only) into a tar in the agent's work folder, the index
  checked unchanged after packing, PUT into the slot the manifest does not name, and then the manifest is
  PUT naming it: the manifest is written last.
- Artifacts: PUT straight to the task attempt's artifact slots, hashed while sent.
URLs are logged without their query (contracts.store.shown): never the signature or the credential.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import re
import secrets
import shutil
import stat
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any
from urllib.parse import urlsplit

from contracts.store import (
    MAX_CHECKPOINT_BYTES,
    MAX_MANIFEST_BYTES,
    Manifest,
    StoreUrls,
    manifest_from,
    other_slot,
    shown,
)
from worker_agent import folders
from worker_agent.folders import FILE_FLAGS, Place

log = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 60.0
CHUNK = 1 << 20
POLL_S = 1.0
MAX_MEMBERS = 10_000
MAX_DEPTH = 16
INDEX_NAME = "checkpoint"  # TensorFlow's CheckpointManager index: written after the files it names
SKIPPED_PREFIX = "workertemp_"  # other workers' throw-away saves (tf_keras distributed_file_utils)
CHECKPOINTS = "checkpoints"
_CKPT_NUMBER = re.compile(rb'model_checkpoint_path:\s*"[^"]*?-(\d+)"')


class StoreError(Exception):
    pass


# --- HTTP ---------------------------------------------------------------------------------------------------------
def _connection(url: str) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return kind(parts.netloc, timeout=HTTP_TIMEOUT_S), target


def http_get(url: str, out: IO[bytes], max_bytes: int) -> tuple[int, int, str]:
    """(status, bytes, sha256) of a GET written to `out` (on 2xx only); StoreError past `max_bytes`."""
    conn, target = _connection(url)
    try:
        conn.request("GET", target)
        response = conn.getresponse()
        if response.status // 100 != 2:
            response.read(64 * 1024)
            return response.status, 0, ""
        digest, size = hashlib.sha256(), 0
        while chunk := response.read(CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise StoreError(f"GET {shown(url)}: more than {max_bytes} bytes")
            digest.update(chunk)
            out.write(chunk)
        return response.status, size, digest.hexdigest()
    except OSError as exc:
        raise StoreError(f"GET {shown(url)}: {exc}") from None
    finally:
        conn.close()


class _Hashing:
    """A file read for a PUT body, hashed as it is read."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, size: int = CHUNK) -> bytes:
        chunk = self.handle.read(size if size and size > 0 else CHUNK)
        self.digest.update(chunk)
        self.size += len(chunk)
        return chunk


def http_put(url: str, body: IO[bytes] | bytes, size: int) -> str:
    """PUT `size` bytes; their SHA-256. StoreError when the store refuses."""
    conn, target = _connection(url)
    hashing = _Hashing(body) if not isinstance(body, bytes) else None
    try:
        conn.putrequest("PUT", target, skip_accept_encoding=True)
        conn.putheader("Content-Length", str(size))
        conn.endheaders()
        if hashing is None:
            assert isinstance(body, bytes)
            conn.send(body)
            digest = hashlib.sha256(body).hexdigest()
        else:
            while hashing.size < size and (chunk := hashing.read(min(CHUNK, size - hashing.size))):
                conn.send(chunk)
            if hashing.size != size:
                raise StoreError(f"PUT {shown(url)}: the file ended at {hashing.size} of {size} bytes")
            digest = hashing.digest.hexdigest()
        response = conn.getresponse()
        text = response.read(4096)
        if response.status // 100 != 2:
            raise StoreError(f"PUT {shown(url)}: {response.status} {_error_code(text)}")
        return digest
    except OSError as exc:
        raise StoreError(f"PUT {shown(url)}: {exc}") from None
    finally:
        conn.close()


def _error_code(text: bytes) -> str:
    found = re.search(rb"<Code>([A-Za-z]{1,64})</Code>", text)
    return found.group(1).decode() if found else ""


# --- restore ------------------------------------------------------------------------------------------------------
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


# --- upload ---------------------------------------------------------------------------------------------------------
Signature = tuple[tuple[str, int, int, bytes], ...]


class CheckpointUploader:
    """A thread that uploads the job folder's checkpoints/ each time a new checkpoint is complete (module docstring)."""

    def __init__(
        self, urls: StoreUrls, job_dir: Place, owner: int | None, scratch: Path, label: str, named: str | None
    ) -> None:
        self.urls = urls
        self.folder = job_dir.child(CHECKPOINTS)
        self.owner = owner
        self.scratch = scratch
        self.label = label
        self.named = named  # the slot the store's manifest names: uploads go to the other one
        self.uploads = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._busy = threading.Lock()  # one upload at a time: the thread's, or the last one at the task's end
        self._uploaded: Signature | None = None

    def start(self) -> None:
        # What is there now (a restored checkpoint) is the store's already.
        self._uploaded = self.signature()
        self._thread = threading.Thread(target=self._run, name=f"checkpoints-{self.label}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def finish(self) -> None:
        """The task is over: stop polling, and upload a last complete checkpoint not yet in the store (before its
        exit is reported, so a restart restores it)."""
        self.stop()
        self.poll()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.poll()
            except Exception:  # never expected: a bug here must not end the task's supervision
                log.exception("%s: checkpoint upload failed", self.label)

    def poll(self) -> bool:
        """One look: upload when the index files changed since the last upload. TensorFlow writes an index after the
        files it names, and only those are packed, so a save under way is not caught half-written; a checkpoint
        replaced while it was packed is packed again (a few tries), then left to the next look."""
        with self._busy:
            for _ in range(3):
                current = self.signature()
                if not current or current == self._uploaded:
                    return False
                if self.upload(current):
                    return True
            return False

    def signature(self) -> Signature:
        """The checkpoint index files (path, size, mtime, content) under checkpoints/: empty when there are none."""
        found = []
        for rel, info, content in self._walk(index_only=True):
            found.append((rel, info.st_size, info.st_mtime_ns, content))
        return tuple(sorted(found))

    def upload(self, expected: Signature) -> bool:
        self.scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
        archive = self.scratch / f"upload-{secrets.token_hex(6)}.tar"
        try:
            if not self._pack(archive) or self.signature() != expected:
                log.info("%s: checkpoint changed while it was packed; next time", self.label)
                return False
            slot = other_slot(self.named)
            size = archive.stat().st_size
            if size > MAX_CHECKPOINT_BYTES:
                log.warning("%s: checkpoint of %d bytes is past the bound; not uploaded", self.label, size)
                return False
            with open(archive, "rb") as body:
                digest = http_put(self.urls.slot_put[slot], body, size)
            manifest = Manifest(slot, digest, size, _number(expected), time.time())
            content = manifest.to_bytes()
            http_put(self.urls.manifest_put, content, len(content))  # last: only now is the slot named
        except StoreError as exc:
            log.warning("%s: checkpoint not uploaded: %s", self.label, exc)
            return False
        finally:
            archive.unlink(missing_ok=True)
        self.named, self._uploaded = slot, expected
        self.uploads += 1
        log.info("%s: checkpoint %s uploaded to slot %s (%d bytes)", self.label, manifest.epoch, slot, size)
        return True

    def _pack(self, archive: Path) -> bool:
        try:
            with tarfile.open(archive, "x:", format=tarfile.PAX_FORMAT) as tar:
                os.chmod(archive, 0o600)
                for rel, info, handle in self._walk(index_only=False):
                    member = tarfile.TarInfo(rel)
                    if handle is None:
                        member.type, member.mode = tarfile.DIRTYPE, 0o700
                        tar.addfile(member)
                        continue
                    member.size, member.mode, member.mtime = info.st_size, 0o600, int(info.st_mtime)
                    tar.addfile(member, handle)
        except (OSError, tarfile.TarError) as exc:  # a file went or shrank mid-read: TensorFlow saved again
            log.info("%s: packing the checkpoint failed (%s); next time", self.label, exc)
            return False
        return True

    def _walk(self, *, index_only: bool) -> Iterator[tuple[str, os.stat_result, Any]]:
        """(relative path, stat, content or open file) of what lies under checkpoints/: regular files and folders the
        task owns, never through a link, workertemp_* skipped. index_only: only the index files, with their bytes."""
        try:
            root = folders.open_folder(self.folder)
        except OSError:
            return
        try:
            yield from self._walk_folder(root, "", 0, index_only)
        finally:
            os.close(root)

    def _walk_folder(self, fd: int, prefix: str, depth: int, index_only: bool) -> Iterator[tuple[str, Any, Any]]:
        names = sorted(folders.entries(fd))
        named = None if index_only or INDEX_NAME not in names else _named_prefixes(fd)
        for name in names:
            if name.startswith(SKIPPED_PREFIX) or name.startswith(".restore-"):
                continue
            if named is not None and name != INDEX_NAME and not any(name.startswith(p) for p in named):
                continue  # beside an index: only the files it names (not a save under way, not a temp folder)
            try:
                info = os.lstat(name, dir_fd=fd)
            except OSError:
                continue
            if self.owner is not None and info.st_uid != self.owner:
                continue
            rel = f"{prefix}{name}"
            if stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
                try:
                    child = os.open(name, folders.DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                try:
                    if not index_only:
                        yield rel, info, None
                    yield from self._walk_folder(child, f"{rel}/", depth + 1, index_only)
                finally:
                    os.close(child)
            elif stat.S_ISREG(info.st_mode) and (not index_only or name == INDEX_NAME):
                try:
                    opened = os.open(name, FILE_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                with os.fdopen(opened, "rb") as handle:
                    same = os.fstat(handle.fileno())
                    if (same.st_dev, same.st_ino) != (info.st_dev, info.st_ino):
                        continue
                    if index_only:
                        yield rel, info, handle.read(64 * 1024)
                    else:
                        yield rel, info, handle


def _named_prefixes(fd: int) -> list[str]:
    """The file-name prefixes ("ckpt-3.") of the checkpoints the index in folder `fd` names."""
    try:
        opened = os.open(INDEX_NAME, FILE_FLAGS, dir_fd=fd)
    except OSError:
        return []
    with os.fdopen(opened, "rb") as handle:
        text = handle.read(64 * 1024)
    paths = re.findall(rb'(?:model_checkpoint_path|all_model_checkpoint_paths):\s*"([^"]{1,4096})"', text)
    return sorted({os.path.basename(p.decode("utf-8", "replace")) + "." for p in paths})


def _number(signature: Signature) -> int | None:
    for _, _, _, content in signature:
        found = _CKPT_NUMBER.search(content)
        if found:
            return int(found.group(1))
    return None


# --- artifacts ------------------------------------------------------------------------------------------------------
class ArtifactSlots:
    """A task attempt's artifact keys: each used once, in order."""

    def __init__(self, urls: list[str]) -> None:
        self._urls = list(urls)
        self._next = 0
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._urls)

    def take(self) -> tuple[int, str] | None:
        with self._lock:
            if self._next >= len(self._urls):
                return None
            slot = self._next
            self._next += 1
            return slot, self._urls[slot]
