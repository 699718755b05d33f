"""A task's own TensorBoard summaries: the folder it is given (env TENSORBOARD_DIR_ENV) and, when it ends, that
folder's files packed into one artifact (`tensorboard-<type>-<index>.tar.gz`) within the artifact limit.

The agent may run as root while the folder belongs to the task's uid, which can change it while it is read: the walk
is relative to directory descriptors opened with O_NOFOLLOW (a symlink anywhere, folder or file, is skipped, never
followed, so a task cannot have the agent pack its token file or another job's checkpoint), takes only regular files
owned by the task's uid when it has one, and stops at MAX_ARTIFACT_BYTES compressed, MAX_FILES files and MAX_DEPTH
folders down. One tar keeps the folder's layout (TensorBoard's run folders: `train/`, `validation/`, ...) and counts
as one artifact against the job's limit, however many event files the script wrote.
"""

from __future__ import annotations

import io
import logging
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

from contracts.limits import MAX_ARTIFACT_BYTES
from contracts.task_messages import LaunchSpec

log = logging.getLogger(__name__)

MAX_FILES = 10_000
MAX_DEPTH = 16
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


class TooLarge(Exception):
    pass


def folder(job_dir: Path, spec: LaunchSpec) -> Path:
    """Where the task writes its summaries: per task slot, so attempts and restarts add to one logdir."""
    return job_dir / "tensorboard" / f"{spec.task_type}-{spec.task_index}"


def artifact_name(spec: LaunchSpec) -> str:
    return f"tensorboard-{spec.task_type}-{spec.task_index}.tar.gz"


def pack(root: Path, owner: int | None, limit: int = MAX_ARTIFACT_BYTES) -> bytes | None:
    """The folder's files as a .tar.gz (paths relative to it), or None when it holds none or is unusable."""
    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError:
        return None  # never created (the script wrote no summaries), or not a folder
    buffer = _Bounded(limit)
    count = 0
    try:
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for relative, fd in _files(top, owner):
                with os.fdopen(fd, "rb") as file:
                    info = archive.gettarinfo(arcname=relative, fileobj=file)
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    info.mode = 0o644
                    archive.addfile(info, file)
                count += 1
                if count >= MAX_FILES:
                    log.warning("%s: more than %d files; the rest is left out", root, MAX_FILES)
                    break
    except TooLarge:
        log.warning("%s: the summaries are over %d bytes packed; not collected", root, limit)
        return None
    except OSError as exc:
        log.warning("%s: could not pack the summaries: %s", root, exc)
        return None
    finally:
        os.close(top)
    return buffer.getvalue() if count else None


def _files(top: int, owner: int | None, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, int]]:
    """(path relative to the root, an open fd) of every regular file under the folder `top`, in name order."""
    for name in sorted(os.listdir(top)):
        try:
            info = os.stat(name, dir_fd=top, follow_symlinks=False)
        except OSError:
            continue
        if owner is not None and info.st_uid != owner:
            continue
        if stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=top)
            except OSError:
                continue  # replaced by a symlink since: O_NOFOLLOW refuses it
            try:
                yield from _files(sub, owner, f"{prefix}{name}/", depth + 1)
            finally:
                os.close(sub)
        elif stat.S_ISREG(info.st_mode):
            try:
                fd = os.open(name, _FILE_FLAGS, dir_fd=top)
            except OSError:
                continue
            opened = os.fstat(fd)  # what was opened, not the name again
            if not stat.S_ISREG(opened.st_mode) or (owner is not None and opened.st_uid != owner):
                os.close(fd)
                continue
            yield f"{prefix}{name}", fd


class _Bounded(io.BytesIO):
    """A BytesIO that refuses to grow past `limit`."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if self.tell() + len(data) > self.limit:
            raise TooLarge
        return super().write(data)
