"""What a task uid leaves behind outside its processes and its job's folders, and its removal before the uid serves
another job: SysV IPC objects (shared memory, semaphore sets, message queues), POSIX message queues, and files in the
host's shared temporary folders (/var/tmp, /dev/shm).

Killing a uid's processes (reaping.py) does not end these: they are kernel objects or files that outlive their
creator, and a next job given the same uid would own them (read a segment's data, a queue's messages, a file's
contents). They are found by owner (the object's owner or its creator, since the owner may hand an object to another
uid with IPC_SET) and removed as root.

POSIX message queues are listed through the mqueue filesystem: at /dev/mqueue where the host mounts it (systemd and
Docker do); elsewhere a short child mounts it in a mount namespace of its own (nothing changes for the host) and
unlinks the uid's queues. The child starts from a fixed environment (`env={}`, `-I -S`): it runs as root, and nothing
of a job may reach it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from worker_agent.supervision.reaping import LOCK_DIR, run_python

log = logging.getLogger(__name__)

SYSVIPC = Path("/proc/sysvipc")
# The host's temporary folders every user may write to and that outlive a job (the job's own /tmp is private and
# removed with it: private_tmp.py). /tmp itself is left out: with task uids it is private per job whenever the host
# has mount namespaces, and walking a host's /tmp at every job start would cost more than it finds.
SHARED_TEMP = (Path("/var/tmp"), Path("/dev/shm"))  # noqa: S108 - the folders cleaned, not used
MAX_DEPTH = 64  # deeper trees are not walked into (a task may nest folders to make the walk costly)
MQUEUE_TIMEOUT_S = 30.0
HOST_MQUEUE = Path("/dev/mqueue")
MQUEUE_MOUNT = LOCK_DIR / "mqueue"  # where the child mounts the mqueue filesystem, in its own mount namespace
IPC_RMID = 0
_KINDS = {"shm": "shmid", "sem": "semid", "msg": "msqid"}
_said: set[str] = set()

# Run as root in a child: its own mount namespace, the mqueue filesystem mounted on a folder of the agent's
# (root-only), every queue owned by the uid (argv[2]) unlinked; prints {"removed": [...], "left": [...]}.
MQUEUE_CHILD = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def call(result, what):
    if result != 0:
        code = ctypes.get_errno()
        raise SystemExit(f"{what}: {os.strerror(code)}")
call(libc.unshare(0x00020000), "unshare")
call(libc.mount(None, b"/", None, ctypes.c_ulong(0x4000 | 0x40000), None), "make / private")
target, uid = sys.argv[1], int(sys.argv[2])
call(libc.mount(b"mqueue", target.encode(), b"mqueue", ctypes.c_ulong(0x2 | 0x4 | 0x8), None), "mount mqueue")
removed, left = [], []
for name in os.listdir(target):
    path = os.path.join(target, name)
    if os.lstat(path).st_uid != uid:
        continue
    try:
        os.unlink(path)
        removed.append(name)
    except OSError:
        left.append(name)
print(json.dumps({"removed": removed, "left": left}))
"""


@dataclass
class Found:
    """What a uid left: `removed` went, `left` is there and could not be removed, `unlisted` could not be looked at
    (message queues where this host lets no mount namespace be made): each a short description."""

    removed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)


def clear(uid: int) -> Found:
    """Remove every SysV IPC object, POSIX message queue and shared temporary file of `uid`. Call only when nothing
    runs as the uid on this machine and no agent here holds it (reaping.py)."""
    found = Found()
    _clear_sysv(uid, found)
    _clear_mqueues(uid, MQUEUE_MOUNT, found)
    for root in SHARED_TEMP:
        _clear_files(root, uid, found)
    if found.removed:
        log.info("uid %s: removed what an earlier job left: %s", uid, ", ".join(found.removed[:20]))
    if found.left:
        log.error("uid %s: could not remove %s", uid, ", ".join(found.left[:20]))
    for what in found.unlisted:
        if what not in _said:  # the same at every job's start and end: said once
            _said.add(what)
            log.warning("could not look for what task uids leave: %s", what)
    return found


# --- SysV IPC -----------------------------------------------------------------------------------------------------
def sysv_objects(uid: int) -> list[tuple[str, int]]:
    """(kind, id) of every SysV IPC object owned or created by `uid`, from /proc/sysvipc (this IPC namespace)."""
    return [(kind, ident) for kind, ident, owner, creator in _sysv_rows() if uid in (owner, creator)]


def _sysv_rows() -> Iterator[tuple[str, int, int, int]]:
    """(kind, id, owner uid, creator uid) of every SysV IPC object of this IPC namespace."""
    for kind, id_column in _KINDS.items():
        try:
            lines = (SYSVIPC / kind).read_text().splitlines()
        except OSError:
            continue  # a kernel without SysV IPC
        header = lines[0].split() if lines else []
        for line in lines[1:]:
            row = dict(zip(header, line.split(), strict=False))
            try:
                yield kind, int(row[id_column]), int(row["uid"]), int(row["cuid"])
            except (KeyError, ValueError):
                continue


def _clear_sysv(uid: int, found: Found) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    remove = {
        "shm": lambda ident: libc.shmctl(ident, IPC_RMID, None),
        "sem": lambda ident: libc.semctl(ident, 0, IPC_RMID),
        "msg": lambda ident: libc.msgctl(ident, IPC_RMID, None),
    }
    for kind, ident in sysv_objects(uid):
        what = f"SysV {kind} {ident}"
        if remove[kind](ident) == 0:
            found.removed.append(what)
        elif (code := ctypes.get_errno()) in (22, 43):  # EINVAL, EIDRM: gone meanwhile
            continue
        else:
            found.left.append(f"{what} ({os.strerror(code)})")


# --- POSIX message queues -------------------------------------------------------------------------------------------
def _clear_mqueues(uid: int, mount: Path, found: Found) -> None:
    if mqueue_mounted(HOST_MQUEUE):  # where systemd and Docker mount it: read in place, no child
        remove_queues(HOST_MQUEUE, uid, found)
        return
    try:
        mount.mkdir(mode=0o700, parents=True, exist_ok=True)
        done = run_python(MQUEUE_CHILD, str(mount), str(uid), timeout=MQUEUE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        found.unlisted.append(f"POSIX message queues ({exc})")
        return
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        found.unlisted.append(f"POSIX message queues ({said[-1] if said else done.returncode})")
        return
    try:
        result = json.loads(done.stdout)
    except ValueError:
        found.unlisted.append("POSIX message queues (the lister's answer was unreadable)")
        return
    found.removed += [f"message queue /{name}" for name in result["removed"]]
    found.left += [f"message queue /{name}" for name in result["left"]]


def mqueue_mounted(path: Path) -> bool:
    """Whether the mqueue filesystem is mounted at `path` in this mount namespace (/proc/self/mountinfo)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    return any(len(fields := line.split()) > 4 and fields[4] == str(path) and " - mqueue " in line for line in lines)


def remove_queues(folder: Path, uid: int, found: Found) -> None:
    """Unlink every queue of `uid` in the mqueue filesystem mounted at `folder` (by fd, following no link)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        found.unlisted.append(f"POSIX message queues ({folder}: {exc.strerror})")
        return
    try:
        for name in os.listdir(fd):
            try:
                if os.stat(name, dir_fd=fd, follow_symlinks=False).st_uid != uid:
                    continue
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                found.left.append(f"message queue /{name} ({exc.strerror})")
                continue
            found.removed.append(f"message queue /{name}")
    finally:
        os.close(fd)


# --- shared temporary folders -------------------------------------------------------------------------------------
def _clear_files(root: Path, uid: int, found: Found) -> None:
    """Below `root`: an entry the uid owns goes (a folder with all in it); a folder of another owner is walked into
    (the uid's files in a world-writable folder someone else made). By fd, following no link, on root's device only."""
    for dir_fd, name, shown, is_dir, _owner in _owned(root, uid.__eq__):
        try:
            if is_dir:
                shutil.rmtree(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)
            found.removed.append(shown)
        except FileNotFoundError:
            continue
        except OSError as exc:
            found.left.append(f"{shown} ({exc.strerror})")


def _owned(root: Path, owned: Callable[[int], bool]) -> Iterator[tuple[int, str, str, bool, int]]:
    """(folder fd, name, path shown, is a folder, owner uid) of each entry below `root` whose owner `owned` accepts,
    not below such an entry; nothing if root cannot be opened. By fd, following no link, on root's device only; the
    folder fd is open until the next entry is asked for."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        yield from _walk(fd, os.fstat(fd).st_dev, owned, str(root), 0)
    finally:
        os.close(fd)


def _walk(
    fd: int, device: int, owned: Callable[[int], bool], shown: str, depth: int
) -> Iterator[tuple[int, str, str, bool, int]]:
    """`_owned` below the open folder `fd`, `depth` folders down from root (`shown`)."""
    try:
        names = os.listdir(fd)
    except OSError:
        return
    for name in names:
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        path = f"{shown}/{name}"
        is_dir = stat.S_ISDIR(info.st_mode)
        if owned(info.st_uid):
            yield fd, name, path, is_dir, info.st_uid
        elif is_dir and info.st_dev == device and depth < MAX_DEPTH:
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                continue
            try:
                yield from _walk(child, device, owned, path, depth + 1)
            finally:
                os.close(child)


def owners(within: Callable[[int], bool]) -> set[int]:
    """The uids `within` accepts that own something `clear` removes (SysV objects, shared temporary files, message
    queues where /dev/mqueue is mounted): one scan, for the agent's start-up."""
    found = {uid for _kind, _id, *uids in _sysv_rows() for uid in uids if within(uid)}
    for root in SHARED_TEMP:
        found |= {owner for *_place, owner in _owned(root, within)}  # `clear` removes each whole
    if mqueue_mounted(HOST_MQUEUE):
        with contextlib.suppress(OSError):
            found |= {
                uid for entry in os.scandir(HOST_MQUEUE) if within(uid := entry.stat(follow_symlinks=False).st_uid)
            }
    return found


def left_by(uid: int) -> list[str]:
    """What of `uid` is still there that `clear` removes (SysV objects and shared temporary files; message queues are
    not listed without a mount): for checks and tests."""
    found = [f"SysV {kind} {ident}" for kind, ident in sysv_objects(uid)]
    for root in SHARED_TEMP:
        found += [shown for _fd, _name, shown, _dir, _owner in _owned(root, uid.__eq__)]
    return found
