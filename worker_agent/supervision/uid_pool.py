"""The pool of task uids on this host (`--task-uids`): which job holds which uid, the job folders each owns, and the
rule that a uid goes to another job only when it is empty (the rule itself and the start-up checks: identity.py).

Which uid a job gets is the control plane's word when its launch order names a uid slot (`LaunchSpec.uid_slot`):
the uid is `low + slot` on every host, and the control plane gives each job of a cluster a slot of its own while any
task of it is active (orchestrator/scheduler/task_uids.py). So one job's tasks on several hosts share one uid (they can
all write the job's shared folder) and two live jobs of a cluster never share one, whichever hosts run them. A slot
beyond this host's range, or a uid this host still holds for another job, is refused with the reason. An order with
no slot (an older control plane) gets a uid chosen here, as before: the owner of the job's existing folder, else
identity.preferred_uid, else the next free one.

On one host a uid belongs to one job at a time. The allocation is persisted by the folders themselves: a job's folder
is owned by its uid, and when a uid goes to a job whose folder it does not own, every other job folder it owns (an
earlier job's, left on disk, under the workdir's jobs/ or a shared folder's) is handed back to root first, so a job
never inherits an earlier job's files with its uid. When a job's last task here ends, every process its uid still
owns is killed (reaping.py), then what it left outside its folders (SysV IPC, POSIX message queues, files in /var/tmp
and /dev/shm: leftovers.py) is removed, before the uid is free; and before a uid serves a job no agent of this machine
holds it for, both are checked again (an agent that died mid-job, a kill that came late). Every ownership walk goes by
fd without following links (folders.py).
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
from worker_agent.supervision import leftovers, reaping
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

    def acquire(self, job_id: int, places: Iterable[Place], slot: int | None = None) -> int:
        """The job's uid, held until `release`; its folders exist, 0700, owned by it (contents too). `slot`: the
        job's place in its cluster's uid pool (the launch order's), None when the order names none. Waits while the
        job's uid, or the uid its slot names, is being emptied (a task that just ended here); raises Unusable when the
        slot lies outside this host's range or its uid still serves another job here."""
        places = list(places)
        with self._cond:
            while self._must_wait(job_id, slot):
                self._cond.wait()
            uid = self._held_by(job_id)
            if slot is not None:
                uid = self._check_slot(job_id, slot, uid)
            holder = self._holders.get(uid) if uid is not None else None
            if holder is None:
                uid = self._choose(job_id, places) if uid is None else self._take(uid, job_id)
            assert uid is not None
            lock = self._claim(uid) if holder is None else None  # waits while another agent empties it
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

    def _must_wait(self, job_id: int, slot: int | None) -> bool:
        """Whether the job's uid here, or the uid its slot names, is being emptied (a task that just ended)."""
        held = self._held_by(job_id)
        if held is not None and self._holders[held].emptying:
            return True
        return slot is not None and self._emptying_for_another(self._slot_uid(slot), job_id)

    def _slot_uid(self, slot: int) -> int:
        if not 0 <= slot < self.uids.size:
            raise Unusable(
                f"the job's uid slot {slot} lies outside this host's --task-uids {self.uids} ({self.uids.size} uids): "
                "the cluster runs more jobs at once than this range holds; give every host of the cluster the same, "
                "wider range"
            )
        return self.uids.low + slot

    def _emptying_for_another(self, uid: int, job_id: int) -> bool:
        holder = self._holders.get(uid)
        return holder is not None and holder.job_id != job_id and holder.emptying

    def _check_slot(self, job_id: int, slot: int, held: int | None) -> int:
        """The uid the slot names, when this host can give it to the job now."""
        uid = self._slot_uid(slot)
        if held is not None and held != uid:
            raise Unusable(f"job {job_id} already runs here as uid {held}; its order names uid {uid} (slot {slot})")
        holder = self._holders.get(uid)
        if holder is not None and holder.job_id != job_id:
            # The control plane took the other job's tasks for ended (a host that was lost, say) while they still run
            # here: the uid is not shared with them.
            raise Unusable(f"uid {uid} (slot {slot}) still serves job {holder.job_id} on this host")
        return uid

    def _take(self, uid: int, job_id: int) -> int:
        """The uid a slot names, for a job this host does not run yet."""
        if uid in self._stuck and reaping.alive(uid.__eq__):
            raise Unusable(f"uid {uid} still runs processes of an earlier job that would not die (see the log)")
        self._stuck.discard(uid)
        self._hand_back(uid, job_id)
        return uid

    def _claim(self, uid: int) -> reaping.UidLock:
        """The uid's machine-wide lock, shared, for a job that gets the uid here. When no agent of this machine holds
        it, it is first checked empty, alone: nothing runs as it, and nothing an earlier job left (IPC objects,
        temporary files) is there."""
        lock = reaping.UidLock.exclusive(uid)
        if lock is None:
            return reaping.UidLock.shared(uid)  # another agent here holds it for this job, or is emptying it
        try:
            self._check_empty(uid)
            lock.share()
        except BaseException:
            lock.close()
            raise
        return lock

    def _check_empty(self, uid: int) -> None:
        running = reaping.empty(uid)
        if running:
            self._note(uid, running)
            raise Unusable(f"uid {uid} still runs processes {running[:5]} of an earlier job that would not die")
        found = leftovers.clear(uid)
        if found.left:
            raise Unusable(f"uid {uid} still has what an earlier job left ({', '.join(found.left[:5])})")

    def release(self, uid: int) -> None:
        """One task of the uid's job is over (its process group is dead). After the last one, the uid is emptied
        (every process it still owns killed, then its SysV IPC objects, message queues and shared temporary files
        removed) before another job can have it."""
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
        running when an earlier agent died), then remove what such uids left (SysV IPC, message queues, shared
        temporary files: leftovers.py), which a uid would otherwise keep until it serves a job again."""
        for uid, pids in sorted(reaping.alive(self.uids.__contains__).items()):
            lock = reaping.UidLock.exclusive(uid)
            if lock is None:
                continue  # another agent here holds it for a running job
            try:
                log.warning("task uid %s still runs %d process(es) of an earlier job: killing them", uid, len(pids))
                self._note(uid, reaping.empty(uid))
            finally:
                lock.close()
        for uid in sorted(leftovers.owners(self.uids.__contains__) - self._stuck):
            lock = reaping.UidLock.exclusive(uid)
            if lock is None:
                continue
            try:
                leftovers.clear(uid)
            finally:
                lock.close()

    def _empty(self, uid: int, lock: reaping.UidLock) -> None:
        try:
            if lock.alone():
                left = reaping.empty(uid)
                self._note(uid, left)
                if not left:  # nothing runs as it that could make more: what the job left outside its folders goes
                    leftovers.clear(uid)
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
