"""The pool of task uids on this host (`--task-uids`): which job holds which uid, the job folders each owns, and the
rule that a uid goes to another job only when it is empty (the rule itself and the start-up checks: identity.py).

On one host a uid belongs to one job at a time: while job A has a task running, a job B that maps to the same uid
takes the next free one. The allocation is persisted by the folders themselves: a job's folder is owned by its uid,
and when a uid goes to a job whose folder it does not own, every other job folder it owns (an earlier job's, left on
disk, under the workdir's jobs/ or a shared folder's) is handed back to root first, so a job never inherits an
earlier job's files with its uid. When a job's last task here ends, every process its uid still owns is killed
(reaping.py) before the uid is free. Every ownership walk goes by fd without following links (folders.py).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from worker_agent import folders
from worker_agent.folders import Place, Roots
from worker_agent.supervision import reaping
from worker_agent.supervision.identity import JOB_FOLDER_MODE, UidRange, Unusable, preferred_uid

log = logging.getLogger(__name__)


# --- per-job uids ---------------------------------------------------------------------------------------------------
@dataclass
class _Holder:
    job_id: int
    tasks: int
    lock: reaping.UidLock
    emptying: bool = False


class TaskUids:
    """The uid of each job with a task running on this host, and the job folders they own."""

    def __init__(self, uids: UidRange, roots: Roots) -> None:
        self.uids = uids
        # Where job folders live: jobs/ under the workdir and under every shared root.
        self.jobs_folders = [Place(root, ("jobs",)) for root in roots.all]
        self._cond = threading.Condition()
        self._holders: dict[int, _Holder] = {}
        self._stuck: set[int] = set()  # uids with a process that would not die: not given out while it lives

    def acquire(self, job_id: int, places: Iterable[Place]) -> int:
        """The job's uid, held until `release`; its folders exist, 0700, owned by it (contents too). Waits while
        the job's uid is being emptied (its previous task here just ended)."""
        places = list(places)
        with self._cond:
            while (uid := self._held_by(job_id)) is not None and self._holders[uid].emptying:
                self._cond.wait()
            holder = self._holders.get(uid) if uid is not None else None
            if holder is None:
                uid = self._choose(job_id, places)
            assert uid is not None
            lock = reaping.UidLock.shared(uid) if holder is None else None  # waits while another agent empties it
            try:
                for place in places:
                    own_folder(place, uid)
            except BaseException:
                if lock is not None:
                    lock.close()
                raise
            if lock is not None:
                holder = self._holders[uid] = _Holder(job_id, 0, lock)
            assert holder is not None
            holder.tasks += 1
            return uid

    def release(self, uid: int) -> None:
        """One task of the uid's job is over (its process group is dead). After the last one, the uid is emptied
        (every process it still owns killed) before another job can have it."""
        with self._cond:
            holder = self._holders[uid]
            holder.tasks -= 1
            if holder.tasks > 0:
                return
            holder.emptying = True
        try:
            self._empty(uid, holder.lock)
        finally:
            with self._cond:
                del self._holders[uid]
                self._cond.notify_all()

    def sweep(self) -> None:
        """At start-up: kill what uids of the range still run that no agent on this machine holds (what a job left
        running when an earlier agent died)."""
        for uid, pids in sorted(reaping.alive(self.uids.__contains__).items()):
            lock = reaping.UidLock.exclusive(uid)
            if lock is None:
                continue  # another agent here holds it for a running job
            try:
                log.warning("task uid %s still runs %d process(es) of an earlier job: killing them", uid, len(pids))
                self._note(uid, reaping.empty(uid))
            finally:
                lock.close()

    def _empty(self, uid: int, lock: reaping.UidLock) -> None:
        try:
            if lock.alone():
                self._note(uid, reaping.empty(uid))
            else:
                log.info("uid %s is still held by another agent on this machine: the last one out empties it", uid)
        finally:
            lock.close()

    def _note(self, uid: int, left: list[int]) -> None:
        if left:
            log.error("uid %s: processes %s would not die (uninterruptible?): not given to another job", uid, left)
            self._stuck.add(uid)
        else:
            self._stuck.discard(uid)

    def _held_by(self, job_id: int) -> int | None:
        return next((uid for uid, holder in self._holders.items() if holder.job_id == job_id), None)

    def _choose(self, job_id: int, places: list[Place]) -> int:
        if self._stuck:
            running = reaping.alive(self._stuck.__contains__)
            self._stuck = set(running)
        taken = self._holders.keys() | self._stuck
        # An existing folder already owned by a free uid of the range keeps it: a restarted task, another host of a
        # cluster sharing the folder, an agent restart.
        owners = [_owner(place) for place in places]
        uid = next((o for o in owners if o in self.uids and o not in taken), None)
        if uid is None:
            offset = preferred_uid(job_id, self.uids) - self.uids.low
            candidates = (self.uids.low + (offset + step) % self.uids.size for step in range(self.uids.size))
            uid = next((c for c in candidates if c not in taken), None)
        if uid is None:
            raise Unusable(f"every task uid of {self.uids} is held by a running job on this host")
        self._hand_back(uid, job_id)
        return uid

    def _hand_back(self, uid: int, job_id: int) -> None:
        """Folders an earlier job left with this uid (under the workdir's jobs/ and the shared folders' jobs/) go to
        root before the uid serves another job."""
        for jobs in self.jobs_folders:
            try:
                fd = folders.open_folder(jobs)
            except FileNotFoundError:
                continue
            try:
                names = [name for name in folders.entries(fd) if name != str(job_id)]
                owned = [name for name in names if _owned_folder(fd, name, uid)]
            finally:
                os.close(fd)
            for name in owned:
                log.info("uid %s now serves job %s: job folder %s handed back to root", uid, job_id, jobs.child(name))
                try:
                    folder = folders.open_folder(jobs.child(name))
                except folders.NotAFolder:
                    continue  # swapped for a link since the listing
                try:
                    folders.chown_tree(folder, 0, only_from=self.uids.__contains__)
                finally:
                    os.close(folder)


def _owned_folder(dir_fd: int, name: str, uid: int) -> bool:
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == uid


def own_folder(place: Place, uid: int) -> None:
    """The folder at `place` exists, mode 0700, owned by uid:uid, with what it holds (written by an earlier holder)
    too; reached and changed by fd, never through a link (folders.py)."""
    fd = folders.open_folder(place, create=True)
    try:
        info = os.fstat(fd)
        if info.st_uid != uid or info.st_gid != uid:
            folders.chown_tree(fd, uid)
        os.fchmod(fd, JOB_FOLDER_MODE)
    finally:
        os.close(fd)


def _owner(place: Place) -> int | None:
    try:
        fd = folders.open_folder(place)
    except OSError:
        return None
    try:
        return os.fstat(fd).st_uid
    finally:
        os.close(fd)
