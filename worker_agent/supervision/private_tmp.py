"""A task's own /tmp, /var/tmp and /dev/shm when the agent is root, like systemd's PrivateTmp=.

Tasks of different jobs would otherwise share the host's /tmp: a script that writes a fixed path (/tmp/my_working_dir,
as TensorFlow's tutorials do) leaves it owned by its job's uid, and the next job running it fails with PermissionError;
what a job leaves there outlives it. So each task starts in a mount namespace of its own (mount_ns.py, run as its
first program): the job's folder `<workdir>/jobs/<id>/tmp` is its /tmp, `<workdir>/jobs/<id>/var-tmp` its /var/tmp
(where a host has one: files there, unlike /tmp's, survive reboots, so a job leaving one there would pass it to every
later job given its uid) and `/dev/shm/tfdash-<agent>/job-<id>` its /dev/shm (memory-backed, and shared by the job's
tasks on this host, as NCCL needs), all owned by the job's uid. A /proc of its own shows it only its own uid's
processes (other jobs' command lines included: hidden), where the kernel allows (5.8+). The agent removes these
folders when the job's last task here is over, after its uid is emptied.

Whether all this works here (root, and allowed to make mount namespaces: a container without CAP_SYS_ADMIN is not)
is tried once when the agent starts; where it does not, tasks share the host's /tmp, /var/tmp and /dev/shm, and the
agent says so. The agent's own folders (and the interpreter) may lie under /tmp: they are bound back at their paths
in the task's /tmp, so the task still reaches them.

mount_ns.py runs as root until it drops to the job's uid, so it starts with LAUNCHER_ENV, nothing of the job's; the
task's environment travels on its stdin, as data, to the execve that starts the task (`TaskStart`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType

from worker_agent import folders
from worker_agent.folders import Place
from worker_agent.supervision import mount_ns

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("mount_ns.py")
COVERED = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108 - the host's shared folders a task gets its own of
SHM = Path("/dev/shm")  # noqa: S108
VAR_TMP = Path("/var/tmp")  # noqa: S108
PROBE_TIMEOUT_S = 30.0
VAR_TMP_FOLDER = "var-tmp"  # in the job's folder here, beside its "tmp"
# The whole environment of the launcher, a root process (systemd and sudo start privileged ones from a fixed one too):
# empty, as nothing it does reads a variable, and Python picks a UTF-8 locale by itself (PEP 538).
LAUNCHER_ENV: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class Mounts:
    """What a task's namespace gets, as mount_ns.py reads it."""

    tmp: Place  # bound onto /tmp
    shm: Place  # bound onto /dev/shm
    var_tmp: Place | None  # bound onto /var/tmp, where the host has one

    @property
    def places(self) -> list[Place]:
        return [self.tmp, self.shm, *([self.var_tmp] if self.var_tmp is not None else [])]


class TaskStart:
    """How the launcher is started: with LAUNCHER_ENV, and the task's environment `env` on its stdin (a memfd, so
    any size up to the bound is written before the launcher reads; closed by `close` once the launcher has it)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(LAUNCHER_ENV)
        self.stdin = os.memfd_create("tfdash-task-env")
        try:
            os.write(self.stdin, mount_ns.encode_env(env))  # a fresh memfd takes it whole: no short write
            os.lseek(self.stdin, 0, os.SEEK_SET)
        except BaseException:
            os.close(self.stdin)
            raise

    def close(self) -> None:
        os.close(self.stdin)


class PrivateTmp:
    """Made by `probe`: `available` says whether tasks get their own /tmp here, `proc` whether their own /proc."""

    def __init__(self, workdir: Path, keep: Iterable[Path]) -> None:
        self.workdir = workdir
        self.keep = _kept(keep)
        # One folder per agent in the host's /dev/shm (several agents may share a machine), named after its workdir.
        self.shm_root = Place(SHM, (f"tfdash-{hashlib.sha256(str(workdir).encode()).hexdigest()[:12]}",))
        self.available = False
        self.proc = False
        self.why_not = ""
        self.var_tmp = VAR_TMP.is_dir()  # a host without one (rare, against the FHS) has nothing there to share

    @classmethod
    def probe(cls, workdir: Path, keep: Iterable[Path]) -> PrivateTmp:
        """Try it once (a namespace with a /tmp, a /dev/shm, the kept folders and a /proc of its own, then without
        the /proc) and keep what worked."""
        made = cls(workdir, keep)
        if sys.platform != "linux" or os.geteuid() != 0:
            made.why_not = "the agent does not run as root"
            return made
        covering = [path for path in made.keep if any(_under(path, cover) for cover in COVERED)]
        if covering:
            made.why_not = f"{covering[0]} holds {', '.join(COVERED)}, which tasks would need to see as they are"
            return made
        for proc in (True, False):
            problem = made._try(proc)
            if not problem:
                made.available, made.proc = True, proc
                break
            made.why_not = problem
        if made.available and made.proc:
            log.info("tasks get their own /tmp, /dev/shm and /proc (a mount namespace each)")
        elif made.available:
            log.warning(
                "tasks get their own /tmp and /dev/shm but not their own /proc (%s): they can read the command "
                "lines of other jobs' processes; mount /proc with hidepid=2 on this host to hide them",
                made.why_not,
            )
        else:
            log.warning(
                "tasks share this host's /tmp and /dev/shm (%s): files one job leaves there can meet the next",
                made.why_not,
            )
        return made

    def _try(self, proc: bool) -> str:
        """Why a namespace (with its own /proc or not) cannot be made here, or "" when it can."""
        source = Path(tempfile.mkdtemp(prefix=".probe-tmp-", dir=self.workdir))
        place = Place(self.workdir, (source.name,))
        try:
            command = [sys.executable, "-I", "-S", "-c", "pass"]
            argv = self._wrap(
                command, Mounts(place, place, place if self.var_tmp else None), None, Path("/"), None, proc
            )
            start = TaskStart({})
            try:
                result = subprocess.run(
                    argv,
                    env=start.env,
                    stdin=start.stdin,
                    capture_output=True,
                    timeout=PROBE_TIMEOUT_S,
                    check=False,
                    cwd="/",
                )
            finally:
                start.close()
        except (OSError, subprocess.SubprocessError) as exc:
            return str(exc)
        finally:
            folders.remove_tree(place)
        said = result.stderr.decode(errors="replace").strip().splitlines()
        return "" if result.returncode == 0 else (said[-1] if said else f"exit status {result.returncode}")

    # --- per job ----------------------------------------------------------------------------------------------------
    def mounts(self, home: Place, job_id: int) -> Mounts:
        """The job's folders for /tmp, /dev/shm and /var/tmp (to be made and owned by its uid before its first task
        starts)."""
        var_tmp = home.child(VAR_TMP_FOLDER) if self.var_tmp else None
        return Mounts(tmp=home.child("tmp"), shm=self.shm_root.child(f"job-{job_id}"), var_tmp=var_tmp)

    def check_shm_root(self) -> None:
        """The agent's folder in the host's /dev/shm (a folder anyone may create things in) is root's and closed to
        others, or no job folder is made in it: whoever owned it could swap a job's folder for one of theirs."""
        fd = folders.open_folder(self.shm_root, create=True, mode=0o711)
        try:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid():
                raise folders.NotAFolder(0, f"{self.shm_root} belongs to uid {info.st_uid}, not the agent: remove it")
            os.fchmod(fd, 0o711)
        finally:
            os.close(fd)

    def wrap(
        self,
        command: list[str],
        mounts: Mounts,
        *,
        uid: int | None,
        cwd: Path,
        umask: int | None,
        also: Iterable[Path] = (),
    ) -> list[str]:
        """The command line that starts `command` in a namespace of its own, as `uid` (None: as the agent); start it
        as TaskStart says, never with the task's environment. `also`: folders this task reads besides the agent's
        (its task environment's installation), bound back like them where they lie under /tmp."""
        return self._wrap(command, mounts, uid, cwd, umask, self.proc, also)

    def _wrap(
        self,
        command: list[str],
        mounts: Mounts,
        uid: int | None,
        cwd: Path,
        umask: int | None,
        proc: bool,
        also: Iterable[Path] = (),
    ) -> list[str]:
        keep = self.keep
        extra = [path for path in _kept(also) if not any(_under(path, cover) for cover in COVERED)]
        if extra:  # a folder that holds /tmp itself cannot be bound back into it: such an installation stays unseen
            keep = _kept([*self.keep, *extra])
        spec = {
            "mounts": [
                [str(mounts.tmp.root), list(mounts.tmp.parts), "/tmp"],  # noqa: S108 - the path it covers
                [str(mounts.shm.root), list(mounts.shm.parts), str(SHM)],
                *([[str(mounts.var_tmp.root), list(mounts.var_tmp.parts), str(VAR_TMP)]] if mounts.var_tmp else []),
            ],
            "keep": [str(path) for path in keep],
            "proc": proc,
            "uid": uid,
            "umask": umask,
            "cwd": str(cwd),
        }
        return [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(spec), "--", *command]

    def remove(self, mounts: Mounts) -> None:
        """The job's last task here is over and its uid emptied: its /tmp, /var/tmp and /dev/shm go."""
        for place in mounts.places:
            try:
                folders.remove_tree(place)
            except OSError as exc:
                log.warning("could not remove %s: %s", place, exc)

    def close(self) -> None:
        """The agent stops with no task left: its folder in the host's /dev/shm goes too, when empty."""
        # Not there, or a job's folder is left (a task that would not die): the agent's next start sweeps it.
        with contextlib.suppress(OSError):
            os.rmdir(self.shm_root.path)

    def sweep(self, jobs: Place) -> None:
        """At start-up (no task runs): what jobs left in their /tmp, /var/tmp and /dev/shm when an earlier agent
        died."""
        stale = [self.shm_root]
        try:
            fd = folders.open_folder(jobs)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            try:
                stale += [jobs.child(name, kind) for name in folders.entries(fd) for kind in ("tmp", VAR_TMP_FOLDER)]
            finally:
                os.close(fd)
        for place in stale:
            try:
                if folders.remove_tree(place):
                    log.info("removed %s, left by a job when an earlier agent stopped", place)
            except OSError as exc:
                log.warning("could not remove %s: %s", place, exc)


def _under(parent: str | Path, path: str | Path) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(parent))


def _kept(paths: Iterable[Path]) -> list[Path]:
    """The real paths of the folders a task needs that lie under /tmp or /dev/shm, outermost only."""
    real = sorted({Path(os.path.realpath(path)) for path in paths if os.path.isdir(path)}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in real:
        if any(_under(cover, path) or _under(path, cover) for cover in COVERED) and not any(
            _under(outer, path) for outer in kept
        ):
            kept.append(path)
    return kept
