"""Who a task runs as, and the folders it owns (`--task-uids A-B`, env TFDASH_TASK_UIDS, agent running as root).

Each job's processes on a host run under a user id of their own, from the configured range, with the same number as
group id and no supplementary group; the job's folders are 0700 and owned by it. So a user's script can read neither
another job's folder nor the agent's files (its workdir is 0711: enter, not list; ledger/ and running/ 0700), nor
signal or trace another job's processes, nor read the agent's /proc/<pid>/environ.

The uid rule, one definition (`preferred_uid`): low + job_id % size, the same on every host with the same range, so
the hosts of a cluster sharing a folder agree on its owner without talking. On one host a uid belongs to one job at a
time: while job A has a task running, a job B that maps to the same uid takes the next free one. The allocation is
persisted by the folders themselves: a job's folder is owned by its uid, and when a uid goes to a job whose folder it
does not own, every other job folder it owns (an earlier job's, left on disk) is handed back to root first, so a job
never inherits an earlier job's files with its uid.
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
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from worker_agent.supervision.programs import SCRIPT_MODE

log = logging.getLogger(__name__)

TASK_UIDS_ENV = "TFDASH_TASK_UIDS"
JOB_FOLDER_MODE = 0o700
WORKDIR_MODE = 0o711  # tasks may enter it (scripts/, jobs/<their job>), not list it
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
            "without root, tasks run as the agent's own user (see the README's threat model)"
        )
    users = sorted(entry.pw_name for entry in pwd.getpwall() if entry.pw_uid in uids)
    groups = sorted(entry.gr_name for entry in grp.getgrall() if entry.gr_gid in uids)
    if users or groups:
        raise Unusable(
            f"--task-uids {uids} overlaps existing accounts (users {users[:5]}, groups {groups[:5]}): "
            "pick a range no user or group of this machine uses"
        )


def prepare(uids: UidRange | None, workdir: Path, token_file: Path | None) -> None:
    """At start-up: with task uids, check the range, lock the workdir down and prove a task uid can run the runtime
    (raises Unusable); as root without them, say loudly what a user's script can then do."""
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
    check_task_can_run(uids, workdir, inherited_env())
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
    """Root-owned; tasks may enter it but not list it; the agent's state folders private; the script cache
    enterable (scripts are root-owned, read-only, named by their content hash)."""
    os.chown(workdir, 0, 0)
    workdir.chmod(WORKDIR_MODE)
    for name in ("ledger", "running"):
        folder = workdir / name
        folder.mkdir(exist_ok=True)
        folder.chmod(PRIVATE_MODE)
    for name in ("scripts", "jobs"):
        folder = workdir / name
        folder.mkdir(exist_ok=True)
        os.chown(folder, 0, 0)
        folder.chmod(WORKDIR_MODE)
    for script in (workdir / "scripts").glob("*.py"):
        script.chmod(SCRIPT_MODE)  # cached by an earlier agent version, 0600


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
    """Start the interpreter as a task uid, import the runtime, enter the script cache and the job folders; raise
    Unusable with the reason (the folder that is closed, or what the probe said) when it cannot."""
    uid = uids.low
    interpreter = Path(sys.executable)
    reachable = [workdir / "scripts", workdir / "jobs"]
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


# --- per-job uids ---------------------------------------------------------------------------------------------------
class TaskUids:
    """The uid of each job with a task running on this host, and the job folders they own."""

    def __init__(self, uids: UidRange, jobs_root: Path) -> None:
        self.uids = uids
        self.jobs_root = jobs_root
        self._lock = threading.Lock()
        self._holders: dict[int, tuple[int, int]] = {}  # uid -> (job_id, tasks running)

    def acquire(self, job_id: int, folders: Iterable[Path]) -> int:
        """The job's uid, held until `release`; its folders exist, 0700, owned by it (contents too)."""
        folders = list(folders)
        with self._lock:
            uid = self._held_by(job_id)
            if uid is None:
                uid = self._choose(job_id, folders)
            for folder in folders:
                own_folder(folder, uid)
            _, count = self._holders.get(uid, (job_id, 0))
            self._holders[uid] = (job_id, count + 1)
            return uid

    def release(self, uid: int) -> None:
        with self._lock:
            job_id, count = self._holders[uid]
            if count <= 1:
                del self._holders[uid]
            else:
                self._holders[uid] = (job_id, count - 1)

    def _held_by(self, job_id: int) -> int | None:
        return next((uid for uid, (holder, _) in self._holders.items() if holder == job_id), None)

    def _choose(self, job_id: int, folders: list[Path]) -> int:
        # An existing folder already owned by a free uid of the range keeps it: a restarted task, another host of a
        # cluster sharing the folder, an agent restart.
        owners = [_owner(folder) for folder in folders]
        uid = next((o for o in owners if o in self.uids and o not in self._holders), None)
        if uid is None:
            offset = preferred_uid(job_id, self.uids) - self.uids.low
            candidates = (self.uids.low + (offset + step) % self.uids.size for step in range(self.uids.size))
            uid = next((c for c in candidates if c not in self._holders), None)
        if uid is None:
            raise Unusable(f"every task uid of {self.uids} is held by a running job on this host")
        self._hand_back(uid, job_id)
        return uid

    def _hand_back(self, uid: int, job_id: int) -> None:
        """Folders an earlier job left under jobs/ with this uid go to root before the uid serves another job."""
        try:
            entries = list(os.scandir(self.jobs_root))
        except FileNotFoundError:
            return
        for entry in entries:
            mine = entry.name == str(job_id) or not entry.is_dir(follow_symlinks=False)
            if not mine and entry.stat(follow_symlinks=False).st_uid == uid:
                log.info("uid %s now serves job %s: job folder %s handed back to root", uid, job_id, entry.path)
                _chown_tree(Path(entry.path), 0, self.uids)


def own_folder(folder: Path, uid: int) -> None:
    """`folder` exists, mode 0700, owned by uid:uid, with what it holds (written by an earlier holder) too."""
    folder.mkdir(parents=True, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise Unusable(f"{folder} is not a folder")
    if info.st_uid != uid or info.st_gid != uid:
        _chown_tree(folder, uid, None)
    folder.chmod(JOB_FOLDER_MODE)


def _chown_tree(root: Path, uid: int, only_from: UidRange | None) -> None:
    """chown without following links. A file with other hard links keeps its owner unless a task uid owns it: it
    may be a link a task made to a file it does not own (the kernel's protected_hardlinks forbids that, but it is a
    setting), and handing it out would give the task that file. Handing back moves only range-owned entries."""
    for path in [root, *_walk(root)]:
        try:
            info = path.lstat()
            if info.st_uid == uid or (only_from is not None and info.st_uid not in only_from):
                continue
            if not stat.S_ISDIR(info.st_mode) and info.st_nlink > 1 and only_from is None:
                log.warning("%s has %d hard links: its owner (uid %s) is kept", path, info.st_nlink, info.st_uid)
                continue
            os.chown(path, uid, uid, follow_symlinks=False)
        except FileNotFoundError:
            continue


def _walk(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):  # does not follow symlinked folders
        found.extend(Path(folder) / name for name in (*dirs, *files))
    return found


def _owner(folder: Path) -> int | None:
    try:
        return folder.lstat().st_uid
    except OSError:
        return None


def task_env(uid: int, home: Path) -> dict[str, str]:
    """What a task under its own uid gets instead of the agent's HOME, temp folder and user name (root's)."""
    name = f"tfdash-task-{uid}"  # no passwd entry: getpass.getuser() reads these first
    return {"HOME": str(home), "TMPDIR": str(home / "tmp"), "USER": name, "LOGNAME": name}
