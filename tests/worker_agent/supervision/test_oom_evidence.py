"""The agent's evidence of an OOM kill: a process really killed by the kernel's OOM killer (a memory cgroup with a
small limit, as root) is found in the kernel's log by its pid; a log of lines is read by pid and by task uid."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker_agent.supervision import oom_evidence

LOG = "\n".join(
    [
        "6,431,4840371416,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        "oom_memcg=/a,task_memcg=/a,task=python3,pid=16308,uid=20001",
        "3,432,4840371463,-;Memory cgroup out of memory: Killed process 16308 (python3) total-vm:323768kB, "
        "anon-rss:65152kB, file-rss:6636kB, shmem-rss:0kB, UID:20001 pgtables:196kB oom_score_adj:0",
        "6,500,4840400000,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
        "task_memcg=/,task=java,pid=777,uid=0",
        "3,501,4840400010,-;Out of memory: Killed process 777 (java) total-vm:1kB, anon-rss:2kB, file-rss:0kB",
    ]
)


def test_the_kernel_log_names_a_task_by_its_pid_or_its_own_uid(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text(LOG)
    by_pid = oom_evidence.kernel_oom_kill({16308}, None, path=str(log))
    assert by_pid == (
        "oom-kill: the kernel killed process 16308 (python3) for lack of its memory cgroup's limit "
        "(total-vm:323768kB, anon-rss:65152kB)"
    )
    assert oom_evidence.kernel_oom_kill({1}, 20001, path=str(log)) == by_pid  # a process of the job's uid
    assert "process 777 (java) for lack of the host's memory" in oom_evidence.kernel_oom_kill({777}, path=str(log))
    # uid 0 is everybody's when tasks do not run as a uid of their own: never evidence by itself.
    assert oom_evidence.kernel_oom_kill({1}, 0, path=str(log)) == ""
    assert oom_evidence.kernel_oom_kill({4242}, 20002, path=str(log)) == ""
    assert oom_evidence.kernel_oom_kill({16308}, None, path=str(tmp_path / "none")) == ""  # unreadable: no evidence


def _memory_cgroup() -> Path | None:
    """A memory cgroup folder this process may make children in (v1 or v2), or None."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (folder / "memory.limit_in_bytes").exists():
                return folder
        if controllers == "" and "memory" in _read(Path("/sys/fs/cgroup") / path.lstrip("/") / "cgroup.controllers"):
            return Path("/sys/fs/cgroup") / path.lstrip("/")
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.fixture
def small_cgroup() -> Iterator[Path]:
    if os.geteuid() != 0 or not os.access(oom_evidence.KMSG, os.R_OK):
        pytest.skip("needs root and a readable /dev/kmsg to make a real OOM kill and read the kernel's account of it")
    parent = _memory_cgroup()
    if parent is None:
        pytest.skip("no memory cgroup to make a child of")
    folder = parent / f"tfdash-oom-test-{os.getpid()}"
    try:
        folder.mkdir()
        limit = "memory.limit_in_bytes" if (folder / "memory.limit_in_bytes").exists() else "memory.max"
        (folder / limit).write_text(str(64 * 1024 * 1024))
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup with a limit here: {exc}")
    yield folder
    folder.rmdir()  # its one process is dead by now


def test_a_process_the_oom_killer_killed_is_found_in_the_kernel_log(small_cgroup: Path) -> None:
    procs = small_cgroup / "cgroup.procs"
    proc = subprocess.Popen(
        [sys.executable, "-c", "x = bytearray(400 * 1024 * 1024); print(len(x))"],
        preexec_fn=lambda: procs.write_text(str(os.getpid())),  # noqa: PLW1509 (the child joins the cgroup first)
        stdout=subprocess.DEVNULL,
    )
    assert proc.wait(timeout=60) == -9  # SIGKILL, sent by the kernel
    evidence = oom_evidence.kernel_oom_kill({proc.pid})
    assert evidence.startswith(f"oom-kill: the kernel killed process {proc.pid} (python")
    assert "for lack of its memory cgroup's limit" in evidence and "anon-rss:" in evidence
