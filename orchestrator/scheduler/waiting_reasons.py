"""What a scheduler pass tells the jobs it does not start: a job that can never run on its cluster fails
(`fail_never`), a reserved job stores when it starts at the latest and where (`tell_reservations`), every other waiting
job why it waits (`tell_waiting`); and the reason texts they read. Called by orchestrator/scheduler/scheduling.py."""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from orchestrator.core import placement
from orchestrator.core.backfill_terms import Outcome, Reservation
from orchestrator.models import Cluster, Job, JobState
from orchestrator.scheduler import queueing
from orchestrator.scheduler.queueing import WAITING_STATES

log = logging.getLogger(__name__)

HELD = "held by staff: it keeps its place and waits until released"
STOPPING_PREVIOUS = "its previous run is being stopped; it is placed again once its processes are gone"
WAITING_UNRESERVED = (
    "waiting: it does not fit now and jobs ahead of it hold the reservations; its start is planned once it is among "
    "the first"
)


def fail_never(job_id: int, cluster: Cluster, why: placement.Unplaceable) -> None:
    # The cluster shrank since the job was accepted: it can never run here now.
    job = Job.objects.select_for_update().filter(pk=job_id, state__in=WAITING_STATES).first()
    if job is None:
        return  # it ended meanwhile (cancelled)
    job.state, job.finished_at = JobState.FAILED, timezone.now()
    job.reason = f"can never run on cluster {cluster.name}: {why.reason}"
    job.save(update_fields=["state", "finished_at", "reason"])


def tell_reservations(reservations: dict[int, Reservation], needs: dict[int, int], behind: dict[int, str]) -> None:
    """A reserved job stores when it starts at the latest and where (the queue view and its page show them);
    `behind`: the notes of the jobs fair share put behind a later one (queueing.sort_queue)."""
    told = Job.objects.filter(pk__in=list(reservations)).values_list("pk", *_TOLD_FIELDS)
    depth = {job_id: n for n, job_id in enumerate(reservations)}  # made in queue order: 0 is the queue's head
    for job_id, restarts, max_restarts, restart_reason, *last in told:
        was = dict(zip(("expected_start", "reservation", "first_reservation_at", "reason"), last, strict=True))
        reserved = reservations[job_id]
        at = datetime.fromtimestamp(reserved.start, tz=UTC)
        where = {host: sorted(ids) for host, ids in sorted(reserved.devices.items())}
        reason = (
            f"waiting for {needs[job_id]} device(s): reserved on {', '.join(where)} from {when(at)} at the "
            "latest, when running jobs reach their time limits"
        )
        if restarts:
            reason += f" (restart {restarts} of {max_restarts}, after: {restart_reason})"
        if job_id in behind:
            reason += f"; {behind[job_id]}"
        fields: dict[str, Any] = {
            "expected_start": at,
            "reservation": {"at": at.isoformat(), "hosts": where},
            "reason": reason,
        }
        if was["first_reservation_at"] is None:
            fields["first_reservation_at"] = at
            # (bench/scale.py reads these lines: EASY promises the head its start, deeper reservations may move.)
            log.info("job %s first reserved at depth %d for %s", job_id, depth[job_id], at.isoformat())
        changed = {name: value for name, value in fields.items() if was[name] != value}
        if changed:
            Job.objects.filter(pk=job_id).update(**changed)


# What telling a reserved job reads of it: its restart story and what it was told last.
_TOLD_FIELDS = ("restarts", "max_restarts", "restart_reason", "expected_start", "reservation", "first_reservation_at",
                "reason")  # fmt: skip


def when(at: datetime) -> str:
    """A time as a waiting person reads it: the time of day, with the date when it is not today."""
    local, today = timezone.localtime(at), timezone.localdate()
    return f"{local:%H:%M:%S}" if local.date() == today else f"{local:%Y-%m-%d %H:%M}"


def tell_waiting(
    jobs: dict[int, queueing.Queued],
    reasons: dict[int, str],
    placed: list[tuple[queueing.Queued, placement.Placement]],
    outcome: Outcome,
    behind: dict[int, str],
) -> None:
    """Every other waiting job says why it waits (and, when fair share put a later job ahead of it, which: `behind`),
    one UPDATE per distinct reason (most share one), of the rows whose reason changes only: no live hint is sent for
    a reason alone (the job's state did not change). Which rows change is judged on what the pass read of them: a
    pass that plans every start tells the whole queue, and an UPDATE matching 2,000 ids to find the few that changed
    was a tenth of such a pass (bench/pass_cost.py). A row written since the read (staff held it, say) is told by the
    next pass whose reason differs from it."""
    done = {job.pk for job, _where in placed} | set(outcome.reservations) | set(outcome.never) | set(outcome.deferred)
    by_reason: dict[str, list[int]] = defaultdict(list)
    for job_id, job in jobs.items():
        if job_id not in done:
            reason = reasons.get(job_id, WAITING_UNRESERVED)
            if job_id in behind and reason != HELD:
                reason += f"; {behind[job_id]}"
            if job.reason != reason or job.told_start:
                by_reason[reason].append(job_id)
    for reason, ids in by_reason.items():
        Job.objects.filter(pk__in=ids).update(reason=reason, expected_start=None, reservation={})
