"""A task's place on this host, made ready before its process starts and cleared when its job leaves the host.

Its folders: the job's home `<workdir>/jobs/<id>` (HOME), the task's own folder in it (its working directory, where
its script is written), the job folder (the order's `job_dir`, which must lie under `jobs/<its job id>` of the
agent's roots: its workdir or a `--shared-root`; anything else is refused, signed or not) and, when the agent is
root, a private /tmp, /var/tmp and /dev/shm (private_tmp.py). With `--task-uids` all of them belong to the job's own
uid (uid_pool.py). When the job's last task here is over, its uid is emptied (every process it still owns killed) and
its private /tmp, /var/tmp and /dev/shm removed; a task of the same job that arrives meanwhile waits for that.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.task_messages import LaunchSpec, TaskEventKind
from contracts.task_wire import JOB_DIR_ENV, TENSORBOARD_DIR_ENV
from worker_agent import folders
from worker_agent.folders import Place, Roots
from worker_agent.supervision import identity, private_tmp, programs, tensorboard_dir
from worker_agent.supervision.launch import HOOKS_DIR, PACKAGE_ROOT, Refused, child_env
from worker_agent.supervision.uid_pool import TaskUids

log = logging.getLogger(__name__)

SHARED_ROOT_ENV = "TFDASH_SHARED_ROOT"


@dataclass
class Prepared:
    """What the supervisor starts: `argv` in `cwd` with `env` (and `popen`'s options), as `uid` (None: the agent's
    user); artifacts are read only from `artifacts_from` (the job's folders)."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    uid: int | None
    artifacts_from: Roots
    tensorboard: Path  # the task's own folder for summaries (env TENSORBOARD_DIR_ENV), packed when it ends
    popen: dict[str, Any] = field(default_factory=dict)
    job_place: Place | None = None  # the job's folder here (checkpoints restored from the object store go there)
    launcher: bool = False  # argv starts mount_ns.py, as root: never with `env` (process_start)

    @contextlib.contextmanager
    def process_start(self) -> Iterator[tuple[Mapping[str, str], int]]:
        """The environment and stdin to start `argv` with: `env` and /dev/null, or, through the launcher (root until
        it drops to the task's uid), a fixed environment and `env` on stdin for the task's own execve only."""
        if not self.launcher:
            yield self.env, subprocess.DEVNULL
            return
        start = private_tmp.TaskStart(self.env)
        try:
            yield start.env, start.stdin
        finally:
            start.close()


class Workspace:
    def __init__(self, workdir: Path, shared_roots: list[Path], task_uids: identity.UidRange | None) -> None:
        self.workdir = workdir
        self.shared_roots = shared_roots
        self.roots = Roots.agent(workdir, shared_roots)
        self.jobs = Place(workdir, ("jobs",))
        # None: tasks run as the agent's user. Else each job's tasks run under a uid of their own (uid_pool.py).
        self.task_uids = None if task_uids is None else TaskUids(task_uids, self.roots)
        self.private_tmp: private_tmp.PrivateTmp | None = None
        if os.geteuid() == 0:
            needed = [workdir, *shared_roots, Path(sys.prefix), Path(sys.base_prefix), PACKAGE_ROOT, HOOKS_DIR]
            self.private_tmp = private_tmp.PrivateTmp.probe(workdir, needed)
        self._cond = threading.Condition()
        self._tasks: dict[int, int] = {}  # job id -> its tasks here with a place
        self._leaving: set[int] = set()  # jobs whose last task here is over, being cleared

    @property
    def private(self) -> bool:
        return self.private_tmp is not None and self.private_tmp.available

    def prepare(self, spec: LaunchSpec, program: programs.Program) -> Prepared:
        """Make the task's place (refusing a job_dir outside the agent's roots); the caller must `leave` once the
        task is over (or did not start). Raises Refused."""
        # Below jobs/<its id> of the workdir or a shared root: not the agent's own state, nor another job's folder.
        own = Roots(base.child("jobs", str(spec.job_id)) for base in self.roots.bases)
        try:
            job_dir = own.place(programs.job_dir(spec, self.workdir))
        except folders.Outside as exc:
            raise Refused(
                TaskEventKind.LAUNCH_FAILED,
                f"job_dir refused: {exc} (this job's folders here; a cluster's shared folder needs --shared-root)",
            ) from None
        home = self.jobs.child(str(spec.job_id))  # this host's folder of the job: its tasks' folders, HOME
        # The attempt is in the name, so a restart gets a new folder; a retried refused launch finds it again.
        cwd = home.child(f"{spec.task_type}-{spec.task_index}-a{spec.attempt}")
        mounts = self.private_tmp.mounts(home, spec.job_id) if self.private and self.private_tmp else None
        # Per task slot, so attempts and restarts add to one logdir (worker_agent/supervision/tensorboard_dir.py).
        summaries = job_dir.child("tensorboard")
        task_summaries = summaries.child(tensorboard_dir.folder(Path(), spec).name)
        # Its TMPDIR (identity.task_env), which is also its /tmp with a namespace of its own.
        places = [home, cwd, job_dir, summaries, task_summaries, *(mounts.places if mounts else [home.child("tmp")])]
        self._enter(spec.job_id)
        uid: int | None = None
        try:
            if mounts is not None and self.private_tmp is not None:
                self.private_tmp.check_shm_root()
            uid = self._own(spec.job_id, places, spec.uid_slot)
            self._write_script(program, cwd, uid)
            return self._command(spec, program, cwd, home, job_dir, task_summaries, uid, mounts)
        except BaseException as exc:
            self.leave(spec.job_id, uid)
            if isinstance(exc, Refused):
                raise
            if isinstance(exc, identity.Unusable | OSError):
                raise Refused(TaskEventKind.LAUNCH_FAILED, f"cannot prepare the task's folders: {exc}") from None
            raise

    def leave(self, job_id: int, uid: int | None) -> None:
        """A task of the job is over (its process group dead) or never started. After the job's last one here: its
        uid emptied and freed, its private /tmp and /dev/shm removed."""
        with self._cond:
            self._tasks[job_id] -= 1
            last = self._tasks[job_id] == 0
            if last:
                del self._tasks[job_id]
                self._leaving.add(job_id)
        try:
            if self.task_uids is not None and uid is not None:
                self.task_uids.release(uid)  # the last one empties the uid: nothing of the job runs on
            if last and self.private_tmp is not None and self.private:
                self.private_tmp.remove(self.private_tmp.mounts(self.jobs.child(str(job_id)), job_id))
        finally:
            if last:
                with self._cond:
                    self._leaving.discard(job_id)
                    self._cond.notify_all()

    def sweep(self) -> None:
        """At start-up, before any task: what earlier jobs left running under task uids, and in their /tmp."""
        if self.task_uids is not None:
            self.task_uids.sweep()
        if self.private_tmp is not None and self.private:
            self.private_tmp.sweep(self.jobs)

    def close(self) -> None:
        """The agent stops and no task is left: what it keeps outside its workdir goes."""
        if self.private_tmp is not None and self.private:
            self.private_tmp.close()

    # --- steps ------------------------------------------------------------------------------------------------------
    def _enter(self, job_id: int) -> None:
        with self._cond:
            while job_id in self._leaving:
                self._cond.wait()
            self._tasks[job_id] = self._tasks.get(job_id, 0) + 1

    def _own(self, job_id: int, places: list[Place], slot: int | None) -> int | None:
        if self.task_uids is not None:
            return self.task_uids.acquire(job_id, places, slot)
        for place in places:
            os.close(folders.open_folder(place, create=True))
        return None

    @staticmethod
    def _write_script(program: programs.Program, cwd: Place, uid: int | None) -> None:
        if program.script is None:
            return
        fd = folders.open_folder(cwd)
        try:
            folders.write_file(fd, program.script_name, program.script, mode=programs.SCRIPT_MODE, uid=uid)
        finally:
            os.close(fd)

    def _command(
        self,
        spec: LaunchSpec,
        program: programs.Program,
        cwd: Place,
        home: Place,
        job_dir: Place,
        summaries: Place,
        uid: int | None,
        mounts: private_tmp.Mounts | None,
    ) -> Prepared:
        argv = program.argv(cwd.path)
        env = child_env(spec, self.workdir)
        env.update(program.env())
        env[JOB_DIR_ENV] = str(job_dir.path)
        env[TENSORBOARD_DIR_ENV] = str(summaries.path)
        if uid is not None:
            env.update(identity.task_env(uid, home.path, home.child("tmp").path))
        popen: dict[str, Any] = {}
        launcher = mounts is not None and self.private_tmp is not None
        if mounts is not None and self.private_tmp is not None:
            env["TMPDIR"] = "/tmp"  # noqa: S108 - the task's own /tmp
            argv = self.private_tmp.wrap(
                argv,
                mounts,
                uid=uid,
                cwd=cwd.path,
                umask=None if uid is None else identity.TASK_UMASK,
                also=[Path(path) for path in program.installations],
            )
        elif uid is not None:
            # setgid/setgroups/setuid in the child between fork and exec (no shell), and files private by default.
            popen = dict(user=uid, group=uid, extra_groups=[], umask=identity.TASK_UMASK)
        artifacts_from = Roots([job_dir, home])
        return Prepared(argv, env, cwd.path, uid, artifacts_from, summaries.path, popen, job_dir, launcher)
