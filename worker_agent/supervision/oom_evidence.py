"""Whether the kernel's OOM killer ended a task: the evidence an agent can read for itself.

A task killed by SIGKILL that the agent did not send was most often killed by the kernel for lack of memory (the
whole host's, or its memory cgroup's limit). The kernel says so in its log: an `oom-kill:` line naming the process,
its pid and uid, then "... out of memory: Killed process PID (NAME) total-vm:..., anon-rss:...". The agent reads its
log from `/dev/kmsg` (readable by root, or where `kernel.dmesg_restrict` is 0) without blocking and looks for one of
the task's processes: its process group's leader by pid, or, when tasks run under a job's own uid (the agent as
root), any process of that uid. The exit's detail then carries that line, which the control plane's verdict
(orchestrator/diagnosis/rules.py, kind host_oom) quotes.

Nothing here may fail an exit: an unreadable log (no permission, no such device) gives no evidence.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Collection, Iterator

KMSG = "/dev/kmsg"
# The whole ring is read once per unexplained SIGKILL (rare); this bounds the read on a host with a huge log buffer.
MAX_RECORDS = 50_000
# `oom-kill:constraint=CONSTRAINT_MEMCG,...,task=python3,pid=16308,uid=20001` (Linux 4.19+).
_OOM_KILL = re.compile(
    r"oom-kill:constraint=(?P<constraint>[A-Z_]+).*?,task=(?P<name>[^,]*),pid=(?P<pid>\d+),uid=(?P<uid>\d+)"
)
# `Memory cgroup out of memory: Killed process 16308 (python3) total-vm:323768kB, anon-rss:65152kB, ...`
_KILLED = re.compile(r"[Oo]ut of memory: Killed process (?P<pid>\d+) \((?P<name>[^)]*)\)(?P<sizes>[^,]*,[^,]*)?")
_WHERE = {"CONSTRAINT_MEMCG": "its memory cgroup's limit", "CONSTRAINT_NONE": "the host's memory"}


def kernel_oom_kill(pids: Collection[int], uid: int | None = None, path: str = KMSG) -> str:
    """The kernel log's account of an OOM kill of one of these processes (by pid, or by `uid` when it is a task uid
    of its own: never 0), newest first; "" when there is none or the log cannot be read."""
    found = ""
    for text in _records(path):
        match = _OOM_KILL.search(text)
        if match is not None and _ours(int(match["pid"]), int(match["uid"]), pids, uid):
            where = _WHERE.get(match["constraint"], match["constraint"])
            found = f"oom-kill: the kernel killed process {match['pid']} ({match['name']}) for lack of {where}"
            continue
        killed = _KILLED.search(text)
        if killed is not None and found and f"process {killed['pid']} " in found and killed["sizes"]:
            found += f" ({killed['sizes'].strip()})"
    return found


def _ours(pid: int, record_uid: int, pids: Collection[int], uid: int | None) -> bool:
    return pid in pids or (uid is not None and uid != 0 and record_uid == uid)


def _records(path: str) -> Iterator[str]:
    """/dev/kmsg hands out one record per read (a read into a buffer too small fails with EINVAL); a plain file (the
    tests') gives many lines per read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        for _ in range(MAX_RECORDS):
            try:
                chunk = os.read(fd, 16_384)
            except BlockingIOError:
                return  # the end of the log
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten while reading: go on from the next
                    continue
                return
            if not chunk:
                return
            yield from chunk.decode("utf-8", "replace").splitlines()
    finally:
        os.close(fd)
