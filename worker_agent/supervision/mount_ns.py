"""The first program of a task when the agent is root: it gives the task a mount namespace of its own, then becomes the
task (`python -I -S mount_ns.py SPEC -- ARGV...`; see private_tmp.py for what SPEC holds and why).

In order, as root: unshare the mount namespace and make every mount in it private (nothing propagates back to the
host); open the folders to keep visible (the agent's workdir, ...) while their paths still reach them; bind the job's
own folders onto /tmp, /var/tmp and /dev/shm (nosuid, nodev); bind each kept folder back at its path under them, on a
folder made by fd walk (never through a link a task planted); mount a /proc of its own that shows only the task's
uid's processes (hidepid=invisible, kernel 5.8+; older kernels refuse the option, so nothing changes for the host);
change to the task's folder again (through the new mounts). Then drop to the task's uid (no groups), set its umask
and exec the task: same pid, same process group, same fds (the metrics pipe).

It runs as root, so it starts from a fixed environment the agent writes (private_tmp.LAUNCHER_ENV), never the task's:
glibc reads GCONV_PATH, LOCPATH, LC_ALL, LD_DEBUG_OUTPUT, GLIBC_TUNABLES and more while any process starts, before
Python could ignore them, and a job's variables naming a gconv module its user planted would run that module as uid 0
(`-I -S` only keeps `PYTHON*` and site packages out). The task's environment comes on stdin instead (a memfd of
`NAME=value` entries, each ending in NUL, as in /proc/PID/environ; at most ENV_MAX_BYTES): read here as data, parsed
strictly, and handed only to the final execve, which already runs as the task's uid. Then stdin is /dev/null again,
as for any task. No deny-list: nothing of the job's reaches a root process, whatever its name.

Standard library only, run isolated (-I -S: no site packages). Any failure: one line on stderr, exit status 126, and
the task never starts.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

CLONE_NEWNS = 0x00020000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
EXIT_FAILED = 126
# The task's environment, as the launcher reads it: what one execve could carry and more (Linux takes at most a
# quarter of the stack limit, 2 MiB by default, for arguments and environment together). The agent refuses to write
# more, and the launcher to read more, so a wrong writer cannot make a root process read without end.
ENV_MAX_BYTES = 4 * 1024 * 1024

_libc = ctypes.CDLL(None, use_errno=True)


def _call(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    _call(
        _libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)),
        f"mount {source or fstype} on {target}",
    )


def _fd_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def _load_folders() -> ModuleType:
    """worker_agent/folders.py, loaded by path (no package is importable in isolated mode)."""
    spec = importlib.util.spec_from_file_location(
        "tfdash_folders", Path(__file__).resolve().parent.parent / "folders.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def enter(spec: dict[str, Any]) -> None:
    folders = _load_folders()
    _call(_libc.unshare(CLONE_NEWNS), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    targets = [target for _, _, target in spec["mounts"]]
    # Every source opened before anything covers it (a source may lie under /tmp); fds opened now belong to this
    # namespace, so they can be bound.
    sources = [folders.open_folder(folders.Place(Path(root), tuple(parts))) for root, parts, _ in spec["mounts"]]
    keep = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) for path in spec["keep"]]
    for source, target in zip(sources, targets, strict=True):
        try:
            _mount(_fd_path(source), target, None, MS_BIND)
        finally:
            os.close(source)
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)
    for path, source in keep:
        target = next(t for t in targets if PurePosixPath(path).is_relative_to(t))
        below = PurePosixPath(path).relative_to(target).parts
        mirror = folders.open_folder(folders.Place(Path(target), below), create=True, mode=0o755)
        try:
            _mount(_fd_path(source), _fd_path(mirror), None, MS_BIND | MS_REC)
        finally:
            os.close(mirror)
            os.close(source)
    if spec["proc"]:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")
    os.chdir(spec["cwd"])
    uid = spec["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if spec["umask"] is not None:  # else the agent's, inherited
        os.umask(spec["umask"])


def encode_env(env: Mapping[str, str]) -> bytes:
    """The task's environment as the launcher reads it on stdin; raises ValueError for what no environment holds."""
    out = bytearray()
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise ValueError(f"{name[:64]!r}: no environment variable can have this name or value")
        out += os.fsencode(name) + b"=" + os.fsencode(value) + b"\0"
    if len(out) > ENV_MAX_BYTES:
        raise ValueError(f"the task's environment is {len(out)} bytes, over the launcher's {ENV_MAX_BYTES}")
    return bytes(out)


def decode_env(data: bytes) -> dict[bytes, bytes]:
    """What encode_env wrote, checked: bytes, never decoded (execve takes them as they are)."""
    if len(data) > ENV_MAX_BYTES:
        raise ValueError(f"the task's environment is over {ENV_MAX_BYTES} bytes")
    if data and not data.endswith(b"\0"):
        raise ValueError("the task's environment does not end with NUL")
    env: dict[bytes, bytes] = {}
    for entry in data.split(b"\0")[:-1]:
        name, sep, value = entry.partition(b"=")
        if not sep or not name or name in env:
            raise ValueError(f"{entry[:64]!r} is not a NAME=value entry, or sets a name twice")
        env[name] = value
    return env


def read_env(fd: int) -> dict[bytes, bytes]:
    chunks, size = [], 0
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > ENV_MAX_BYTES:
            break  # decode_env refuses it; never read on
    return decode_env(b"".join(chunks))


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: mount_ns.py SPEC -- ARGV... < ENVIRONMENT")
    command = argv[3:]
    try:
        env = read_env(0)
        null = os.open(os.devnull, os.O_RDONLY)  # the task's stdin, as without a launcher
        os.dup2(null, 0)
        os.close(null)
        enter(json.loads(argv[1]))
        os.execve(command[0], command, env)  # noqa: S606 - an argv, no shell
    except Exception as exc:
        print(f"tfdash: could not start the task in its own mount namespace: {exc}", file=sys.stderr, flush=True)
        os._exit(EXIT_FAILED)


if __name__ == "__main__":
    main(sys.argv)
