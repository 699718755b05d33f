"""Each cluster's pool of task uid slots: which job's tasks run as which uid on every host of the cluster.

An agent with `--task-uids A-B` runs a job's tasks as uid A + the job's slot (worker_agent/supervision/uid_pool.py).
The control plane gives the slots, one per job per cluster, because only it sees the whole cluster: when each host
chose on its own (job id modulo its range, or the next free uid), two live jobs on two hosts could get the same uid
and so each other's files in the cluster's shared folder, and one job's tasks on two hosts could get two uids and not
both write its folder. A slot is given when the job is placed, by the scheduler's pass, which holds the cluster's row
lock (orchestrator/control/scheduling.py), so two passes never give one slot twice; a unique constraint on (cluster,
slot) says so to the database too. The job keeps it while any task of it is active (the launch orders of an attempt,
and their resends, all carry the same); once none is, the slot is free and the next job placed may take it (lowest
free first, so slots stay below the number of jobs a cluster runs at once; an agent refuses one beyond its range).

A slot is not freed by a hook where tasks end: a job with no active task simply no longer counts as holding it, and
the job that takes it clears it from the old holder in the same transaction. An agent reports a task ended only once
its uid is empty (no process left, nothing left in SysV IPC or /var/tmp: worker_agent/supervision/leftovers.py), so a
slot is handed on only when its uid is clean on every host; a host the control plane took for lost that still runs
the old job refuses the new one's launch with the reason instead of sharing the uid.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from django.db import connection
from django.db.models import Exists, OuterRef

from orchestrator.models import ACTIVE_TASK_STATES, Job, Task


def assign(cluster_id: int, jobs: Iterable[Job]) -> None:
    """Give each of `jobs` (being placed now on the cluster, in the pass that holds its lock) a slot: its own when it
    kept one (a restarted job), else the lowest one no job with an active task holds. Sets `task_uid_slot` on the
    objects and the rows."""
    jobs = list(jobs)
    placing = {job.pk for job in jobs}
    holders = Job.objects.filter(cluster_id=cluster_id, task_uid_slot__isnull=False).annotate(
        live=Exists(Task.objects.filter(job=OuterRef("pk"), state__in=ACTIVE_TASK_STATES))
    )
    held: set[int] = set()
    stale: dict[int, int] = {}  # slot -> a job with no active task that still names it
    for pk, slot, live in holders.values_list("pk", "task_uid_slot", "live"):
        if live or pk in placing:
            held.add(slot)
        else:
            stale[slot] = pk
    free = (slot for slot in itertools.count() if slot not in held)
    given: dict[int, int] = {}
    for job in sorted(jobs, key=lambda job: job.pk):
        if job.task_uid_slot is None:
            job.task_uid_slot = given[job.pk] = next(free)
    if not given:
        return
    # The old holders first: the constraint is checked row by row.
    taken_from = [stale[slot] for slot in given.values() if slot in stale]
    if taken_from:
        Job.objects.filter(pk__in=taken_from).update(task_uid_slot=None)
    # One statement for the pass's jobs, as the pass writes its other columns (scheduling._start).
    table = Job._meta.db_table
    values = ", ".join(["(%s, %s)"] * len(given))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS job SET task_uid_slot = v.slot FROM (VALUES {values}) AS v(id, slot) "  # noqa: S608
            "WHERE job.id = v.id",
            [number for pair in given.items() for number in pair],
        )
