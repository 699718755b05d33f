"""The folders the agent acts on: a path an order names is kept under the agent's own roots (its workdir and the
cluster's shared folder), and every walk below a root goes by file descriptor (openat with O_NOFOLLOW, fstat, fchown),
so a link a task swaps in mid-walk cannot turn an action onto a file outside (`/etc`).

A root itself is opened as the operator named it (it may be a link, e.g. a mounted share); nothing below it is ever
followed. Stdlib only: the task launcher (supervision/mount_ns.py) loads this file by path, before any package is
importable.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A regular file opened to read or fchown it: never follow, never wait (a FIFO), never become a terminal's owner.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
MAX_PATH_CHARS = 4096
MAX_DEPTH = 256  # a deeper tree (a task can make one) is refused, not walked until the fds run out


class Outside(ValueError):
    """A path that is not under one of the agent's roots (or is no plain absolute path); the message says why."""


class NotAFolder(OSError):
    """Something below a root is a link, a file or missing where a folder must be."""


@dataclass(frozen=True)
class Place:
    """A folder or file below a root: the root (opened as named) and the names below it (never followed)."""

    root: Path
    parts: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return self.root.joinpath(*self.parts)

    def child(self, *names: str) -> Place:
        for name in names:
            if not name or name in (".", "..") or "/" in name or "\0" in name:
                raise Outside(f"{name!r} is not a plain file name")
        return Place(self.root, (*self.parts, *names))

    def parent(self) -> Place:
        if not self.parts:
            raise Outside(f"{self.root} is a root: its parent is not the agent's")
        return Place(self.root, self.parts[:-1])

    def __str__(self) -> str:
        return str(self.path)


class Roots:
    """Where paths an order (or a task) names must lie: below one of these places."""

    def __init__(self, bases: Iterable[Place]) -> None:
        self.bases = tuple(bases)

    @classmethod
    def agent(cls, workdir: Path, shared: Iterable[Path] = ()) -> Roots:
        """The agent's own roots: its workdir first, then the shared folders (--shared-root)."""
        paths = dict.fromkeys(Path(os.path.abspath(path)) for path in (workdir, *shared))
        return cls(Place(path) for path in paths)

    @property
    def all(self) -> tuple[Path, ...]:
        return tuple(base.path for base in self.bases)

    def place(self, path: object) -> Place:
        """The Place of `path`, an absolute path without `..` below a base (as named, or as its root resolves);
        raises Outside. The longest matching base wins (a workdir inside the shared folder is the workdir)."""
        if not isinstance(path, str | Path):
            raise Outside("the path must be a string")
        text = str(path)
        if not text or len(text) > MAX_PATH_CHARS or "\0" in text:
            raise Outside("the path must be a non-empty string without NUL, at most 4096 characters")
        pure = PurePosixPath(text)
        if not pure.is_absolute():
            raise Outside(f"{text} is not an absolute path")
        if ".." in pure.parts:
            raise Outside(f"{text} contains '..'")
        best: Place | None = None
        matched = 0
        for base in self.bases:
            real = PurePosixPath(os.path.realpath(base.root)).joinpath(*base.parts)
            for spelling in (PurePosixPath(base.path), real):
                size = len(spelling.parts)
                if pure.parts[:size] == spelling.parts and size > matched:
                    best, matched = Place(base.root, (*base.parts, *pure.parts[size:])), size
        if best is None:
            raise Outside(f"{text} is not under {', '.join(map(str, self.all))}")
        return best


# --- walking ------------------------------------------------------------------------------------------------------
def open_folder(place: Place, *, create: bool = False, mode: int = 0o755) -> int:
    """An fd of the folder at `place`, reached from its root one name at a time without following links; missing
    folders are made (`mode`, as the agent's user) when `create`. Raises NotAFolder or OSError."""
    fd = os.open(place.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, name in enumerate(place.parts):
            child = _step(fd, name, create, mode, place.root.joinpath(*place.parts[: depth + 1]))
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _step(fd: int, name: str, create: bool, mode: int, shown: Path) -> int:
    """`name` under the folder `fd`, opened as a folder without following it."""
    try:
        try:
            return os.open(name, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, mode, dir_fd=fd)
            return os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotAFolder(exc.errno, f"{shown} is not a folder (a link or a file)") from None
        raise


def entries(dir_fd: int) -> list[str]:
    """The names in a folder (a separate step, so tests can swap a name for a link between listing and acting)."""
    return os.listdir(dir_fd)


def _lstat_at(dir_fd: int, name: str) -> os.stat_result:
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def chown_tree(dir_fd: int, uid: int, *, only_from: Callable[[int], bool] | None = None) -> None:
    """chown the folder `dir_fd` and all below it to uid:uid, by fd, never through a link.

    Handing out (`only_from` None): a file with other hard links keeps its owner, as it may be a link a task made
    to a file it does not own (the kernel's protected_hardlinks forbids that, but it is a setting). Handing back
    (`only_from` given): only entries whose owner it accepts move. An entry swapped between listing and acting is
    skipped (a link is never followed; a folder or file opened is checked to be the one listed)."""
    _chown_folder(dir_fd, uid, only_from, depth=0)


def _wants(info: os.stat_result, uid: int, only_from: Callable[[int], bool] | None) -> bool:
    return info.st_uid != uid and (only_from is None or only_from(info.st_uid))


def _chown_folder(fd: int, uid: int, only_from: Callable[[int], bool] | None, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise OSError(errno.ELOOP, f"a folder tree deeper than {MAX_DEPTH} levels")
    if _wants(os.fstat(fd), uid, only_from):
        os.fchown(fd, uid, uid)
    for name in entries(fd):
        try:
            info = _lstat_at(fd, name)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode):
            child = _open_same(name, fd, DIR_FLAGS, info)
            if child is not None:
                try:
                    _chown_folder(child, uid, only_from, depth + 1)
                finally:
                    os.close(child)
        elif _wants(info, uid, only_from):
            _chown_entry(fd, name, info, uid, only_from)


def _chown_entry(fd: int, name: str, info: os.stat_result, uid: int, only_from: Callable[[int], bool] | None) -> None:
    if info.st_nlink > 1 and only_from is None:
        log.warning("%s has %d hard links: its owner (uid %s) is kept", name, info.st_nlink, info.st_uid)
        return
    if not stat.S_ISREG(info.st_mode):
        # A link, FIFO or socket: the entry itself, never what it points to.
        with contextlib.suppress(FileNotFoundError):
            os.chown(name, uid, uid, dir_fd=fd, follow_symlinks=False)
        return
    opened = _open_same(name, fd, FILE_FLAGS, info)
    if opened is None:
        return
    try:
        if os.fstat(opened).st_nlink > 1 and only_from is None:
            return  # linked since the listing
        os.fchown(opened, uid, uid)
    finally:
        os.close(opened)


def _open_same(name: str, dir_fd: int, flags: int, listed: os.stat_result) -> int | None:
    """`name` opened without following it, if it is still what was listed (same kind, device and inode)."""
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:  # gone, or a link now (ELOOP), or no longer a folder (ENOTDIR)
        log.warning("%s changed while it was walked (%s): skipped", name, exc.strerror)
        return None
    info = os.fstat(fd)
    if (info.st_dev, info.st_ino, stat.S_IFMT(info.st_mode)) != (
        listed.st_dev,
        listed.st_ino,
        stat.S_IFMT(listed.st_mode),
    ):
        os.close(fd)
        log.warning("%s was swapped while it was walked: skipped", name)
        return None
    return fd


# --- files --------------------------------------------------------------------------------------------------------
def read_file(place: Place, *, owner: int | None, max_bytes: int) -> bytes | str:
    """The content of the regular file at `place` (owned by `owner` when given), or why it cannot be read. Checked
    before it is opened (lstat by fd) and after (fstat: the same file), never through a link."""
    fd = open_file(place, owner=owner, max_bytes=max_bytes)
    if isinstance(fd, str):
        return fd
    try:
        return read_fd(fd, max_bytes)
    finally:
        os.close(fd)


def read_fd(fd: int, max_bytes: int) -> bytes | str:
    """What the open file `fd` holds (at most `max_bytes`), or why it cannot be read. The caller closes `fd`."""
    chunks: list[bytes] = []
    size = 0
    try:
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:  # it grew after its size was checked
                return f"more than {max_bytes} bytes"
    except OSError as exc:
        return f"cannot read it: {exc.strerror}"
    return b"".join(chunks)


def open_file(place: Place, *, owner: int | None, max_bytes: int) -> int | str:
    """An fd (the caller closes it) of the regular file at `place`, owned by `owner` when given and of at most
    `max_bytes` when opened, or why not: checked as `read_file` checks, never through a link."""
    if not place.parts:
        return "not a regular file"
    try:
        parent = open_folder(place.parent())
    except OSError as exc:
        return f"cannot open it: {exc.strerror or exc}"
    try:
        name = place.parts[-1]
        try:
            info = _lstat_at(parent, name)
        except OSError as exc:
            return f"cannot open it: {exc.strerror}"
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        if owner is not None and info.st_uid != owner:
            return f"owned by uid {info.st_uid}, not by the task's uid {owner}"
        if info.st_size > max_bytes:
            return f"{info.st_size} bytes, more than {max_bytes}"
        fd = _open_same(name, parent, FILE_FLAGS, info)
        if fd is None:
            return "it changed while it was read"
        return fd
    finally:
        os.close(parent)


def write_file(dir_fd: int, name: str, content: bytes, *, mode: int, uid: int | None = None) -> None:
    """`name` in the folder `dir_fd` holds `content`, mode `mode`, owned by uid:uid when given: written to a new
    file (O_EXCL, never through a link) and renamed over whatever had the name."""
    temp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if uid is not None:
                os.fchown(fd, uid, uid)
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


def remove_tree(place: Place) -> bool:
    """Remove the folder at `place` and all in it (shutil's fd-based walk, which follows no link); False when it
    was not there."""
    try:
        parent = open_folder(place.parent())
    except FileNotFoundError:
        return False
    try:
        shutil.rmtree(place.parts[-1], dir_fd=parent)
    except FileNotFoundError:
        return False
    finally:
        os.close(parent)
    return True
