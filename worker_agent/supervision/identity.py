"""Who a task runs as (`--task-uids A-B`, env TFDASH_TASK_UIDS, agent running as root): the uid rule, the agent's
own folders, and the start-up checks. Which job holds which uid, and the folders each owns: uid_pool.py.

Each job's processes on a host run under a user id of their own, from the configured range, with the same number as
group id and no supplementary group; the job's folders are 0700 and owned by it. So a user's script can read neither
another job's folder nor the agent's files (its workdir is 0711: enter, not list; ledger/ and running/ 0700), nor
signal or trace another job's processes, nor read the agent's /proc/<pid>/environ.

Which uid: the launch order's `uid_slot` (low + slot), which the control plane gives each job of a cluster while it
has an active task, so every host of the cluster runs the job as one uid and no two live jobs of the cluster share
one (uid_pool.py; hosts of a cluster need the same range). An order without one (an older control plane) falls back
to `preferred_uid`: low + job_id % size, the same on every host with the same range, but two jobs a range apart
collide there, and a host that finds it taken picks another.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import re
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from worker_agent import folders
from worker_agent.folders import Place
from worker_agent.supervision import reaping

log = logging.getLogger(__name__)

TASK_UIDS_ENV = "TFDASH_TASK_UIDS"
JOB_FOLDER_MODE = 0o700
WORKDIR_MODE = 0o711  # tasks may enter it (jobs/<their job>), not list it
PRIVATE_MODE = 0o700  # ledger/, running/: the agent's own
TASK_UMASK = 0o077
PROBE_TIMEOUT_S = 60.0
MAX_UID = 2**31 - 2  # the kernel's uid_t is 32 bits; (uid_t)-1 means "unchanged" to setreuid


class Unusable(Exception):
    """The configured range or the installation cannot isolate tasks; the message says why and what to do."""


@dataclass(frozen=True)
class UidRange:
    low: int
    high: int

    @property
    def size(self) -> int:
        return self.high - self.low + 1

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.low <= uid <= self.high

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"


def parse_range(value: str) -> UidRange:
    """`A-B`, both inclusive; raises ValueError with the rule."""
    match = re.fullmatch(r"(\d+)-(\d+)", value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a user id range like 20000-29999")
    low, high = int(match[1]), int(match[2])
    if not 1 <= low <= high <= MAX_UID:
        raise ValueError(f"{value!r}: user ids must satisfy 1 <= first <= last <= {MAX_UID}")
    return UidRange(low, high)


def preferred_uid(job_id: int, uids: UidRange) -> int:
    return uids.low + job_id % uids.size


def check_range(uids: UidRange) -> None:
    """Refuse a range that holds a known user or group: a task would get that account's files and rights."""
    if os.geteuid() != 0:
        raise Unusable(
            f"--task-uids {uids} needs the agent to run as root (it runs as uid {os.geteuid()}); "
            "without root, tasks run as the agent's own user (see docs/security/threat-model.md)"
        )
    users = sorted(entry.pw_name for entry in pwd.getpwall() if entry.pw_uid in uids)
    groups = sorted(entry.gr_name for entry in grp.getgrall() if entry.gr_gid in uids)
    if users or groups:
        raise Unusable(
            f"--task-uids {uids} overlaps existing accounts (users {users[:5]}, groups {groups[:5]}): "
            "pick a range no user or group of this machine uses"
        )


def prepare(uids: UidRange | None, workdir: Path, token_file: Path | None, shared_roots: Sequence[Path] = ()) -> None:
    """At start-up: with task uids, check the range, lock the workdir down and prove a task uid can run the runtime
    (raises Unusable); as root without them, say loudly what a user's script can then do. Either way, say which
    shared root is missing or closed to tasks (its jobs would fail)."""
    for root in shared_roots:
        closed = closed_ancestor(root / "jobs") if uids is not None else None
        if not root.is_dir():
            log.warning("the shared root %s is not a folder here (yet): jobs of its cluster fail until it is", root)
        elif closed is not None:
            log.warning("the shared root %s is under %s, which task uids cannot enter: its jobs fail", root, closed)
    if uids is None:
        if os.geteuid() == 0:
            log.warning(
                "the agent runs as root without --task-uids: every task runs as root and can read this agent's "
                "token, environment and files, and every other job's folder; give tasks their own users with "
                "--task-uids (e.g. 20000-29999) or env %s",
                TASK_UIDS_ENV,
            )
        return
    from worker_agent.supervision.launch import inherited_env

    check_range(uids)
    secure_workdir(workdir)
    check_task_can_run(uids, workdir, inherited_env(workdir))
    if token_file is not None:
        info = token_file.stat()
        if info.st_mode & 0o077 or info.st_uid in uids:
            log.warning(
                "the token file %s is mode %o owned by uid %s: make it 0600 and root's, or a task may read it",
                token_file,
                stat.S_IMODE(info.st_mode),
                info.st_uid,
            )
    log.info("tasks run under their job's own uid from %s (jobs/ folders 0700, owned by it)", uids)


def task_uids_problem(uids: UidRange, workdir: Path) -> str | None:
    """Why an agent with these task uids and workdir would refuse to start, found without starting anything (the
    range holds an account, or a folder task uids must enter is closed); None when nothing is in the way. For a
    launcher (`make run`) that picks task uids when it can."""
    try:
        check_range(uids)
    except Unusable as exc:
        return str(exc)
    from worker_agent.supervision.launch import PACKAGE_ROOT

    for path in (Path(sys.executable).resolve(), Path(sys.base_prefix), PACKAGE_ROOT, workdir):
        closed = closed_ancestor(path)
        if closed is not None:
            return (
                f"{path} is under {closed} (mode {stat.S_IMODE(closed.stat().st_mode):o}), which task uids cannot enter"
            )
    return None


# --- the agent's own folders --------------------------------------------------------------------------------------
def secure_workdir(workdir: Path) -> None:
    """Root-owned; tasks may enter it but not list it; the agent's state folders private. The script cache of
    earlier versions (scripts/, readable by every task uid) is removed: a task's script lives in its own folder."""
    os.chown(workdir, 0, 0)
    workdir.chmod(WORKDIR_MODE)
    for name in ("ledger", "running"):
        folder = workdir / name
        folder.mkdir(exist_ok=True)
        folder.chmod(PRIVATE_MODE)
    jobs = workdir / "jobs"
    jobs.mkdir(exist_ok=True)
    os.chown(jobs, 0, 0)
    jobs.chmod(WORKDIR_MODE)
    if folders.remove_tree(Place(workdir, ("scripts",))):
        log.info("removed %s, the shared script cache of an earlier agent version", workdir / "scripts")


def closed_ancestor(path: Path) -> Path | None:
    """The first folder on the way to `path` that a user other than its owner and group cannot enter, if any.

    Task uids own none of these folders and are in no group, so "others" bits decide."""
    current = Path("/")
    for part in Path(os.path.abspath(path)).parts[1:]:
        try:
            mode = current.stat().st_mode
        except OSError:
            return current
        if not mode & stat.S_IXOTH:
            return current
        current = current / part
    return None


PROBE = (
    "import os, sys\n"
    "import worker_agent.runtime\n"
    "for path in sys.argv[1:]:\n"
    "    if not os.access(path, os.X_OK):\n"
    "        sys.exit(f'cannot enter {path}')\n"
)


def check_task_can_run(uids: UidRange, workdir: Path, env: dict[str, str]) -> None:
    """Start the interpreter as a task uid, import the runtime, enter the job folders; raise Unusable with the reason
    (the folder that is closed, or what the probe said) when it cannot."""
    uid = uids.low
    interpreter = Path(sys.executable)
    reachable = [workdir / "jobs"]
    # Held as for a job: another agent of this machine, starting meanwhile, must not take the probe for a leftover.
    lock = reaping.UidLock.shared(uid)
    try:
        result = subprocess.run(
            [sys.executable, "-c", PROBE, *map(str, reachable)],
            env=env,
            cwd="/",
            user=uid,
            group=uid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unusable(_advice(uid, interpreter, workdir, f"it could not be started: {exc}")) from None
    finally:
        lock.close()
    if result.returncode != 0:
        said = result.stderr.decode(errors="replace").strip().splitlines()
        raise Unusable(_advice(uid, interpreter, workdir, said[-1] if said else f"exit status {result.returncode}"))


def _advice(uid: int, interpreter: Path, workdir: Path, said: str) -> str:
    from worker_agent.supervision.launch import PACKAGE_ROOT

    lines = [f"task uid {uid} cannot run tasks here ({said})."]
    named = {
        "the interpreter": interpreter.resolve(),
        "the interpreter's installation": Path(sys.base_prefix).resolve(),
        "the checkout (worker_agent's folder)": PACKAGE_ROOT,
        "the agent's workdir": workdir,
    }
    for what, path in named.items():
        closed = closed_ancestor(path)
        if closed is not None:
            mode = stat.S_IMODE(closed.stat().st_mode)
            lines.append(f"{what} {path} is under {closed} (mode {mode:o}), which other users cannot enter.")
    lines.append(
        "Tasks under --task-uids must be able to run the venv's Python and read the checkout: make the venv from a "
        "system Python (scripts/install.sh prefers /usr/bin/python3.11), keep the checkout and the --workdir out of "
        "private folders such as /root, or run the agent without --task-uids (tasks then run as root)."
    )
    return " ".join(lines)


def task_env(uid: int, home: Path, tmp: Path) -> dict[str, str]:
    """What a task under its own uid gets instead of the agent's HOME, temp folder and user name (root's)."""
    name = f"tfdash-task-{uid}"  # no passwd entry: getpass.getuser() reads these first
    return {"HOME": str(home), "TMPDIR": str(tmp), "USER": name, "LOGNAME": name}
