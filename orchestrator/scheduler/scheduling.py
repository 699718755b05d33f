"""A scheduler pass over one cluster: rows in, the plan (orchestrator/core/backfill.py), task rows and launch orders
out. The queue is walked in its order (orchestrator/scheduler/queueing.py: priority classes, fair share); with the
`fifo` policy a job that does not fit holds back the jobs behind it, with `backfill` a job behind starts only where it
delays no reservation; preemption is considered after (orchestrator/scheduler/preemption.py).

One scheduler pass per cluster at a time (the cluster row is locked for the whole pass; the orchestrator's passes
that find it locked end at once, the running one or the watchdog's next reads the queue afresh), so two passes, in
two threads or two orchestrator workers, never hand out the same port or device. What a pass writes for the jobs it
starts is orchestrator/scheduler/starts.py, what it tells the jobs that wait orchestrator/scheduler/waiting_reasons.py;
plans that write nothing (a job's shape, submission's plan) orchestrator/scheduler/job_plans.py.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from orchestrator.core import backfill, placement, preflight, scheduler_policy
from orchestrator.core.backfill_terms import Reservation, Waiting
from orchestrator.core.shapes import devices_needed
from orchestrator.models import (
    ACTIVE_TASK_STATES,
    Cluster,
    JobState,
    Task,
)
from orchestrator.plumbing import counters, gc_pause, thread_times
from orchestrator.plumbing import pass_requests as passes
from orchestrator.preflight import runs, settling
from orchestrator.scheduler import fleet_state, preemption, queueing, task_uids
from orchestrator.scheduler.job_plans import job_shape, packing_of
from orchestrator.scheduler.starts import start
from orchestrator.scheduler.waiting_reasons import (
    HELD,
    STOPPING_PREVIOUS,
    WAITING_UNRESERVED,
    fail_never,
    tell_reservations,
    tell_waiting,
)

log = logging.getLogger(__name__)

PASS_TIME = "scheduler_pass_s"  # noqa: S105 - a counter name; counters.observe: each pass (GET /metrics)


def schedule_cluster(cluster_id: int, *, wait: bool = True) -> list[int]:
    """Start every queued job of the cluster that fits, in FIFO order; returns the ids of jobs started. `wait`
    False (the orchestrator's passes): when another pass holds the cluster, end at once (see below)."""
    began = time.perf_counter()
    try:
        with (
            gc_pause.paused()
        ):  # the collector runs after the pass, over what is left (orchestrator/plumbing/gc_pause.py)
            return _pass(cluster_id, wait=wait)
    finally:
        counters.observe(PASS_TIME, time.perf_counter() - began)


def _pass(cluster_id: int, *, wait: bool) -> list[int]:
    clock = thread_times.Stopwatch()
    passes.pass_begins(cluster_id)
    started: list[int] = []
    tasks = 0
    with transaction.atomic():
        # Not waiting (skip_locked): when another pass (another thread or orchestrator worker) holds the cluster,
        # this one has nothing to add; it began after this ask was made, or the watchdog's next tick (every second
        # while jobs wait) covers it. Waiting tied up a worker thread per blocked pass, and with them the heartbeats
        # that worker had already taken from the queue (suspected: hosts declared lost while their reports sat there).
        cluster = Cluster.objects.select_for_update(skip_locked=not wait).filter(pk=cluster_id).first()
        if cluster is None:
            if Cluster.objects.filter(pk=cluster_id).exists():
                log.debug("cluster %s: a scheduler pass is already running", cluster_id)
            return []
        waiting = _settle_preflights(queueing.queued(cluster.pk))
        if not waiting:
            return []
        now = timezone.now()  # the pass's one clock: its reservations count from the placements it writes
        fleet = fleet_state.read(cluster, now)
        placed = _plan_pass(cluster, waiting, fleet, now)
        started = start(placed, fleet.host_ids, now)
        # Their uid slots, in the same transaction as their tasks (the launch orders go out on commit).
        task_uids.assign(cluster.pk, started, live={gang.job_id for gang in fleet.gangs})
        tasks = sum(len(where.tasks) for job, where in placed if job.pk in started)
    if started:  # committed (bench/scale.py reads these lines: placement throughput)
        # (Its thread's CPU time and its wait for a core beside the wall time: the rest is the queries'.)
        log.info("scheduler pass over cluster %s placed %d task(s) of %d job(s) in %s", cluster_id, tasks,
                 len(started), clock.spent())  # fmt: skip
    return started


def _plan_pass(
    cluster: Cluster, waiting: list[queueing.Queued], fleet: fleet_state.Fleet, now: datetime
) -> list[tuple[queueing.Queued, placement.Placement]]:
    """Walk the queue in order: start what may start (backfill), reserve for the first jobs that cannot, preempt for
    the first reserved one that may, and tell every waiting job why it waits and when it starts at the latest."""
    policy = scheduler_policy.POLICIES[settings.TFDASH_SCHEDULER_POLICY]
    classes, default_value = queueing.class_values()
    share = queueing.shares(cluster, (job.owner_id for job in waiting), fleet.usage, fleet.held_since, now.timestamp())
    shapes = {job.pk: job_shape(job) for job in waiting}
    needs = {pk: devices_needed(shape) for pk, shape in shapes.items()}
    behind = queueing.sort_queue(waiting, classes, default_value, share, lambda job: needs[job.pk])
    planner = backfill.Planner(
        fleet.states,
        fleet.gangs,
        now=now.timestamp(),
        depth=policy.reservations(settings.TFDASH_BACKFILL_DEPTH),
        take=placement.take,
        previous=_reserved.get(cluster.pk),
        packing=packing_of(cluster),
    )
    grace = fleet_state.release_margin(cluster)
    placed: list[tuple[queueing.Queued, placement.Placement]] = []
    reasons: dict[int, str] = {}
    stopping = _still_stopping([job for job in waiting if job.state in (JobState.RESTARTING, JobState.PREEMPTED)])
    for job in waiting:
        if job.held:
            reasons[job.pk] = HELD
            continue
        if job.awaits is not None:  # its preflight runs (orchestrator/core/preflight.py): it holds nothing meanwhile
            reasons[job.pk] = runs.waiting_reason(job.awaits)
            continue
        if job.pk in stopping:
            # Its previous gang is still being stopped: a new one must not meet the old processes.
            reasons[job.pk] = job.reason or STOPPING_PREVIOUS
            if policy.holds_back:
                break
            continue
        outcome = planner.offer(Waiting(job.pk, shapes[job.pk], job.time_limit_s + grace))
        if isinstance(outcome, placement.Placement):
            job.borrowing = share.over(job.owner_id, needs[job.pk])
            share.use(job.owner_id, needs[job.pk])
            placed.append((job, outcome))
        elif policy.holds_back and job.pk not in planner.outcome.never:
            break  # strict first come, first served: nothing passes a job that does not fit
    planner.finish(plan_all=_plan_all_due(cluster.pk, waiting))
    _reserved[cluster.pk] = dict(planner.outcome.reservations)
    out = planner.outcome
    log.debug("pass over cluster %s: %d waiting, %d started, %d reserved, %d unplanned, %d left as they were",
              cluster.pk, len(waiting), len(out.started), len(out.reservations), len(out.unplaced),
              len(out.deferred))  # fmt: skip
    by_id = {job.pk: job for job in waiting}
    for job_id, why in planner.outcome.never.items():
        fail_never(job_id, cluster, why)
    tell_reservations(planner.outcome.reservations, needs, behind)
    for job_id, unplaced in planner.outcome.unplaced.items():
        reasons[job_id] = WAITING_UNRESERVED if unplaced is None else f"{unplaced.reason}; {WAITING_UNRESERVED}"
    tell_waiting(by_id, reasons, placed, planner.outcome, behind)
    if policy.preempts:
        preemption.consider(
            cluster, waiting, planner, share, needs, lambda job: shapes[job.pk], (classes, default_value)
        )
    return placed


# The latest starts shown are planned again at least this often (each plan is a few placements per waiting job at the
# head of the queue); in between, a pass plans only what it must to decide (Planner.offer).
PLAN_EVERY_S = 5.0
_planned_at: dict[int, float] = {}  # cluster id -> monotonic time of its last full plan, in this process
_reserved: dict[int, dict[int, Reservation]] = {}  # cluster id -> its last pass's reservations (this process)


def _plan_all_due(cluster_id: int, waiting: list[queueing.Queued]) -> bool:
    """Whether this pass plans every waiting job's start: every PLAN_EVERY_S, and at once for a job never planned
    (one just submitted: its page should say when it starts)."""
    now = time.monotonic()
    fresh = any(job.state == JobState.QUEUED and not job.reason and not job.held for job in waiting)
    if fresh or now - _planned_at.get(cluster_id, float("-inf")) >= PLAN_EVERY_S:
        _planned_at[cluster_id] = now
        return True
    return False


def _settle_preflights(waiting: list[queueing.Queued]) -> list[queueing.Queued]:
    """The queue once the ended preflights of its jobs are applied (orchestrator/preflight/settling.py): a job
    refused by its preflight leaves it, one cleared is placed as any other."""
    awaiting = {job.pk: job.awaits for job in waiting if job.awaits is not None}
    if not awaiting:
        return waiting
    settled = settling.settle(awaiting)
    for job in waiting:
        if job.pk in settled:
            job.awaits, job.reason = None, ""
    return [job for job in waiting if settled.get(job.pk) != preflight.FAILED]


def _still_stopping(jobs: list[queueing.Queued]) -> set[int]:
    if not jobs:
        return set()
    active = Task.objects.filter(job_id__in=[job.pk for job in jobs], state__in=ACTIVE_TASK_STATES)
    return set(active.values_list("job_id", flat=True))
