"""Preemption in a scheduler pass: the first reserved job that may preempt stops the cheapest set of jobs that frees
what it needs (orchestrator/core/preemption.py chooses), instead of waiting for its reservation.

Who may be preempted by a waiting job W: a running job of a lower class that is preemptible (staff mark classes so),
or, when W's owner is within their quota, a job that started beyond its own owner's quota (it borrowed idle devices:
Kueue's reclaim). A victim's gang gets SIGTERM, the cluster's grace, then SIGKILL; it goes back to the queue with its
place kept and resumes from its last checkpoint; it uses up none of its restarts (lifecycle.preempt). A job inside
its class's minimum run time, or shielded after its class's bound on preemptions, is no victim (no thrash:
orchestrator/core/preemption.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple

from django.db.models import Max, Q

from orchestrator.core import backfill, backfill_terms, preemption
from orchestrator.core.placement import Placement, place
from orchestrator.core.shapes import JobShape
from orchestrator.jobs import lifecycle
from orchestrator.models import Cluster, Job, JobState, MetricPoint
from orchestrator.scheduler import fleet_state, queueing

log = logging.getLogger(__name__)


class Running(NamedTuple):
    """A running job some waiting job may preempt, as a pass reads it."""

    pk: int
    class_id: int | None
    borrowing: bool
    owner_id: int
    placed_at: datetime | None
    shielded: bool


PREEMPTING = "preempting {victims} ({why}); it starts once their tasks have stopped"


def consider(
    cluster: Cluster,
    waiting: list[queueing.Queued],
    planner: backfill.Planner,
    share: queueing.Shares,
    needs: dict[int, int],
    shape_of: Callable[[queueing.Queued], JobShape],
    classes: tuple[dict[int, tuple[int, bool]], int],
) -> list[int]:
    """Preempt for the reserved jobs that may, in queue order, each from what the earlier ones left (their victims'
    devices count as free, what they will take as used); returns the ids of the jobs preempted."""
    reserved = planner.outcome.reservations
    # A job whose reservation is due about when gangs being stopped now are gone (an earlier preemption, a job's end:
    # their devices count free after fleet_state.release_margin) waits for them: preempting more for it would stop
    # jobs for nothing.
    due = planner.now + fleet_state.release_margin(cluster) + cluster.stop_grace_s
    # A preflight never preempts: it is one device for a few steps, not worth another job's work.
    preemptors = [job for job in waiting if job.pk in reserved and reserved[job.pk].start > due and job.checks is None]
    if not preemptors:
        return []
    classes_by_id, default_value = classes
    # Only jobs some preemptor may stop are read (every pass asks, and on a busy fleet most running jobs are of the
    # default class): a preemptible class below the highest preemptor's, or devices borrowed beyond a quota.
    highest = max(_value(job, classes_by_id, default_value) for job in preemptors)
    lower = [pk for pk, (value, preemptible) in classes_by_id.items() if preemptible and value < highest]
    running = Job.objects.filter(cluster=cluster, state__in=(JobState.STARTING, JobState.RUNNING), ending="")
    rows = [
        Running(*row)
        for row in running.filter(Q(priority_class_id__in=lower) | Q(borrowing=True)).values_list(
            "pk", "priority_class_id", "borrowing", "owner_id", "placed_at", "preemption_shielded"
        )
    ]
    if not rows:
        return []
    by_class, default_protection = queueing.class_protections()
    protection = {
        row.pk: by_class.get(row.class_id, default_protection) if row.class_id else default_protection for row in rows
    }
    rows = [row for row in rows if _may_be_stopped(row, protection[row.pk], planner.now)]
    if not rows:
        return []
    gangs = {gang.job_id: gang for gang in planner.running}
    since: dict[int, float] | None = None
    states = planner.states
    preempted: list[int] = []
    for job in preemptors:
        why = _eligible(job, rows, classes_by_id, default_value, share, needs, taken=set(preempted))
        if not why:
            continue
        if since is None:
            since = _work_at_risk(rows, planner.now)
        candidates = [preemption.Candidate(pk, gangs[pk].devices, since[pk]) for pk in why if pk in gangs]
        shape = shape_of(job)
        victims = preemption.choose_victims(shape, states, candidates, planner.packing)
        if not victims:
            continue
        for victim in sorted(victims):  # their rows locked in id order (orchestrator/models/row_locks.py)
            lifecycle.preempt(victim, by=job.pk, why=why[victim], protection=protection[victim])
        preempted += victims
        freed: dict[str, frozenset[int]] = {}
        for victim in victims:
            for host, ids in gangs[victim].devices.items():
                freed[host] = freed.get(host, frozenset()) | ids
        states = backfill_terms.free(states, freed)
        where = place(shape, states, packing=planner.packing)
        if isinstance(where, Placement):
            states = planner.take(states, where)  # the next preemptor must not count on these
        share.use(job.owner_id, needs[job.pk])
        reasons = sorted({why[v] for v in victims})
        job.reason = PREEMPTING.format(victims=", ".join(f"#{v}" for v in victims), why="; ".join(reasons))
        Job.objects.filter(pk=job.pk).update(reason=job.reason)
        log.info("job %s preempts %s", job.pk, victims)
    return preempted


def _eligible(
    job: queueing.Queued,
    rows: list[Running],
    classes: dict[int, tuple[int, bool]],
    default_value: int,
    share: queueing.Shares,
    needs: dict[int, int],
    *,
    taken: set[int],
) -> dict[int, str]:
    """The running jobs `job` may preempt, and why."""
    value = _value(job, classes, default_value)
    reclaims = not share.over(job.owner_id, needs[job.pk])
    why: dict[int, str] = {}
    for pk, class_id, borrowing, owner_id, _placed, _shielded in rows:
        if pk in taken:
            continue
        victim_value, preemptible = (
            classes.get(class_id, (default_value, False)) if class_id else (default_value, False)
        )
        if preemptible and victim_value < value:
            why[pk] = "a lower priority class"
        elif borrowing and reclaims and share.account_of.get(owner_id) != share.account_of[job.owner_id]:
            why[pk] = "devices borrowed beyond its owner's quota"
    return why


def _may_be_stopped(row: Running, protection: preemption.Protection, now: float) -> bool:
    """Past its class's minimum run time, and not shielded by its bound on preemptions."""
    placed_at = row.placed_at.timestamp() if row.placed_at else None
    return preemption.protected_until(placed_at, protection, shielded=row.shielded) <= now


def _work_at_risk(rows: list[Running], now: float) -> dict[int, float]:
    """Seconds each running job would redo if stopped now: since its last epoch end (its checkpoint), or its start;
    none for a run that saves at the stop's step (its facts' saves_at_stop, worker_agent/runtime/preemption.py)."""
    ids = [row.pk for row in rows]
    checkpoints = dict(
        MetricPoint.objects.filter(job_id__in=ids, phase="epoch_end")
        .values("job_id")
        .annotate(latest=Max("ts"))
        .values_list("job_id", "latest")
    )
    saving = set(Job.objects.filter(pk__in=ids, facts__saves_at_stop=True).values_list("pk", flat=True))
    return {
        row.pk: 0.0
        if row.pk in saving
        else now - max(checkpoints.get(row.pk) or 0.0, row.placed_at.timestamp() if row.placed_at else 0.0)
        for row in rows
    }


def _value(job: queueing.Queued, classes: dict[int, tuple[int, bool]], default_value: int) -> int:
    return classes[job.priority_class_id][0] if job.priority_class_id in classes else default_value
