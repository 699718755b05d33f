"""Each cluster's pool of task uid slots: which job's tasks run as which uid on every host of the cluster.

An agent with `--task-uids A-B` runs a job's tasks as uid A + the job's slot (worker_agent/supervision/uid_pool.py).
The control plane gives the slots, one per job per cluster, because only it sees the whole cluster: when each host
chose on its own (job id modulo its range, or the next free uid), two live jobs on two hosts could get the same uid
and so each other's files in the cluster's shared folder, and one job's tasks on two hosts could get two uids and not
both write its folder. A slot is given when the job is placed, by the scheduler's pass, which holds the cluster's row
lock (orchestrator/scheduler/scheduling.py), so two passes never give one slot twice; a unique constraint on (cluster,
slot) says so to the database too. The job keeps it while any task of it is active (the launch orders of an attempt,
and their resends, all carry the same) and while it is not finished (a restart or a preemption places it again with
the uid that owns its folders); once it is finished and no task of it is active, the next job placed may take the
slot (lowest free first, so slots stay below the number of jobs a cluster runs or holds at once; an agent refuses one
beyond its range).

A slot is not freed by a hook where tasks end: a finished job with no active task simply no longer counts as holding
it, and the job that takes it clears it from the old holder in the same transaction. Which jobs have an active task
is what the pass read already (fleet_state's gangs, one per job with an active task on the cluster's hosts), so the
pool costs a pass one read of the slot column (the unique constraint's index) and, when it places jobs, one UPDATE.
An agent reports a task ended only once its uid is empty (no process left, nothing left in SysV IPC, message queues
or /var/tmp: worker_agent/supervision/leftovers.py), so a slot is handed on only when its uid is clean on every host;
a host the control plane took for lost that still runs the old job refuses the new one's launch with the reason
instead of sharing the uid.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection

from django.db import connection

from orchestrator.models import TERMINAL_JOB_STATES, Job


def assign(cluster_id: int, job_ids: Collection[int], live: Collection[int]) -> None:
    """Give each job of `job_ids` (placed now on the cluster, by the pass that holds its lock) a slot: its own when it
    kept one (a restarted job), else the lowest one that no unfinished job, nor any of `live` (those with an active
    task, as the pass read them: fleet_state's gangs), holds."""
    if not job_ids:
        return
    placing = set(job_ids)
    rows = Job.objects.filter(cluster_id=cluster_id, task_uid_slot__isnull=False).order_by()
    held: set[int] = set()
    have: set[int] = set()
    stale: dict[int, int] = {}  # slot -> a finished job that still names it
    for pk, slot, state in rows.values_list("pk", "task_uid_slot", "state"):
        if pk in placing:
            have.add(pk)
        if pk in placing or pk in live or state not in TERMINAL_JOB_STATES:
            # Not finished (restarting, preempted, waiting to be placed again) keeps its slot too: its folders
            # stay its uid's, and no other job's hosts hand them back to root meanwhile.
            held.add(slot)
        else:
            stale[slot] = pk
    free = (slot for slot in itertools.count() if slot not in held)
    given = {pk: next(free) for pk in sorted(placing - have)}
    if not given:
        return
    # The old holders first: the constraint is checked row by row.
    taken_from = [stale[slot] for slot in given.values() if slot in stale]
    if taken_from:
        Job.objects.filter(pk__in=taken_from).update(task_uid_slot=None)
    # One statement for the pass's jobs, as the pass writes its other columns (orchestrator/scheduler/starts.py).
    values = ", ".join(["(%s, %s)"] * len(given))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Job._meta.db_table} AS job SET task_uid_slot = v.slot "  # noqa: S608 - the model's table
            f"FROM (VALUES {values}) AS v(id, slot) WHERE job.id = v.id",
            [number for pair in given.items() for number in pair],
        )
