"""The queue as people see it (like `squeue --start`) and what staff do to it: hold, release, change the priority.

Everyone signed in sees every waiting job's place, owner, priority, shape and expected start (a shared fleet's queue
is the team's business, as Slurm's is), and each priority class's rule (who may use it: class_rights); a job's name
and reason only its owner and staff, as everywhere else. Staff may move a job to a class its owner may not use
themselves; the job's history says so.
"""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction

from orchestrator.models import Cluster, Job, JobEvent, PriorityClass
from orchestrator.plumbing import pass_requests as passes
from orchestrator.scheduler import class_rights, fleet_state, job_plans, queueing


class QueueActionRefused(Exception):
    pass


def rows(cluster: Cluster, user: Any) -> list[dict[str, Any]]:
    out = []
    for position, job in enumerate(ordered_queue(cluster), start=1):
        mine = user.is_staff or job.owner_id == user.pk
        out.append(
            {
                "position": position,
                "id": job.pk,
                "name": job.name if mine else "",
                "owner": job.owner.get_username(),
                "priority": job.priority,
                "state": job.state,
                "held": job.held,
                "strategy": job.strategy,
                "workers": job.workers,
                "ps": job.ps,
                "devices": job_plans.placement_needs(job),
                "time_limit_s": job.time_limit_s,
                "reason": job.reason if mine else "",
                "expected_start": job.expected_start,
                "reservation": job.reservation or {},
                "submitted_at": job.created_at,
                "fair_share": round(job.fair_share, 4),  # type: ignore[attr-defined]
                "decayed_usage_h": round(job.decayed_usage_s / 3600, 2),  # type: ignore[attr-defined]
                "visible": mine,
            }
        )
    return out


def _waiting(job_id: int) -> Job:
    job = Job.objects.select_for_update().get(pk=job_id)
    if job.state not in queueing.WAITING_STATES:
        raise QueueActionRefused(
            f"Job #{job.pk} is {job.state}: only a waiting job can be held, released or reprioritised."
        )
    return job


def hold(job_id: int, by: str) -> Job:
    with transaction.atomic():
        job = _waiting(job_id)
        if not job.held:
            job.held = True
            job.save(update_fields=["held"])
            JobEvent.objects.create(job=job, kind="held", text=f"held by {by}")
        passes.schedule_after_commit(job.cluster_id)
    return job


def release(job_id: int, by: str) -> Job:
    with transaction.atomic():
        job = _waiting(job_id)
        if job.held:
            job.held = False
            job.save(update_fields=["held"])
            JobEvent.objects.create(job=job, kind="released", text=f"released by {by}")
        passes.schedule_after_commit(job.cluster_id)
    return job


def set_priority(job_id: int, name: str, by: str) -> Job:
    found = PriorityClass.objects.filter(name=name).first()
    if found is None:
        names = ", ".join(PriorityClass.objects.values_list("name", flat=True)) or "none defined"
        raise QueueActionRefused(f"Unknown priority class {name[:40]!r}; choose one of: {names}.")
    with transaction.atomic():
        job = _waiting(job_id)
        if job.priority_class_id != found.pk:
            before = job.priority or "default"
            job.priority_class = found
            job.save(update_fields=["priority_class"])
            JobEvent.objects.create(job=job, kind="priority", text=priority_story(before, found, job.owner, by))
        passes.schedule_after_commit(job.cluster_id)
    return job


def priority_story(before: str, to: PriorityClass, owner: Any, by: str) -> str:
    """The history line of a class change; it says when staff lifted a job above its owner's own right."""
    beyond = "" if class_rights.may_use(to, owner) else f" (beyond {owner.get_username()}'s own right)"
    return f"priority {before} -> {to.name} by {by}{beyond}"


def ordered_queue(cluster: Cluster) -> list[Job]:
    """The cluster's waiting jobs in the order a pass walks them (the queue view, a job page's place), each with its
    account's fair-share factor and decayed usage (`fair_share`, `decayed_usage_s`) as the pass computes them."""
    waiting = queueing.queued(cluster.pk)
    classes, default_value = queueing.class_values()
    devices, since = fleet_state.usage(cluster.pk)
    share = queueing.shares(cluster, (job.owner_id for job in waiting), devices, since, time.time())
    queueing.sort_queue(waiting, classes, default_value, share, job_plans.placement_needs)
    rows = Job.objects.select_related("owner", "priority_class").in_bulk([job.pk for job in waiting])
    ordered = [rows[job.pk] for job in waiting if job.pk in rows]
    for job in ordered:
        account = share.account_of[job.owner_id]
        job.fair_share = share.factor.get(account, 1.0)  # type: ignore[attr-defined]
        job.decayed_usage_s = share.decayed.get(account, 0.0)  # type: ignore[attr-defined]
    return ordered


def queue_place(job: Job) -> tuple[int, Job | None]:
    """How many jobs wait ahead of a waiting `job` on its cluster, and the first of them (None when it is first or not
    waiting): the job page says so."""
    if job.state not in queueing.WAITING_STATES:
        return 0, None
    queue = ordered_queue(job.cluster)
    ahead = next((i for i, other in enumerate(queue) if other.pk == job.pk), 0)
    return ahead, (queue[0] if ahead else None)
