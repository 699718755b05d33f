"""Uploading a job's checkpoints to the object store while its authoritative task runs (the chief, else worker 0).

When the checkpoint index files under checkpoints/ (TensorFlow's `checkpoint`, written after the data files) change,
the files each index names are packed (read by fd, never through a link, the task's own only) into a tar in the
agent's work folder, the index checked unchanged after packing, PUT into the slot the manifest does not name, and
then the manifest is PUT naming it: the manifest is written last.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import stat
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from contracts.store import MAX_CHECKPOINT_BYTES, Manifest, StoreUrls, other_slot
from worker_agent import folders
from worker_agent.folders import FILE_FLAGS, Place
from worker_agent.supervision.checkpoint_restore import CHECKPOINTS, MAX_DEPTH
from worker_agent.supervision.store_http import StoreError, http_put

log = logging.getLogger(__name__)

POLL_S = 1.0
INDEX_NAME = "checkpoint"  # TensorFlow's CheckpointManager index: written after the files it names
SKIPPED_PREFIX = "workertemp_"  # other workers' throw-away saves (tf_keras distributed_file_utils)
_CKPT_NUMBER = re.compile(rb'model_checkpoint_path:\s*"[^"]*?-(\d+)"')

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
