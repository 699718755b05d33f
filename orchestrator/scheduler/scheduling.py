"""FIFO gang scheduling of queued jobs onto a cluster: rows in, `placement.place`, task rows and launch orders out.

One scheduler pass per cluster at a time (the cluster row is locked for the whole pass; the orchestrator's passes
that find it locked end at once, the running one or the watchdog's next reads the queue afresh), so two passes, in
two threads or two orchestrator workers, never hand out the same port or device. Strict FIFO: a job that does not
fit holds back the jobs behind it, so a big job is not starved by a stream of small ones.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from contracts.strategies import Strategy
from orchestrator.core import backfill, placement, tf_config
from orchestrator.core.assignment import Packing
from orchestrator.core.backfill_terms import Outcome, Reservation, Waiting
from orchestrator.core.shapes import JobShape, devices_needed
from orchestrator.environments import availability
from orchestrator.jobs import dispatch, lifecycle
from orchestrator.metrics import live
from orchestrator.models import (
    ACTIVE_TASK_STATES,
    Cluster,
    Job,
    JobState,
    Task,
)
from orchestrator.models.validators import parse_labels
from orchestrator.plumbing import counters, gc_pause, thread_times
from orchestrator.plumbing import pass_requests as passes
from orchestrator.scheduler import fleet_state, preemption, queueing, task_rows, task_uids

log = logging.getLogger(__name__)


def job_shape(job: Job | queueing.Queued) -> JobShape:
    return _shape(job.strategy, job.workers, job.ps, job.devices_per_worker, job.labels, job.environment)


@lru_cache(maxsize=4096)
def _shape(
    strategy: str, workers: int, ps: int, devices_per_worker: int, labels: str, environment: str = ""
) -> JobShape:
    # Asked of every waiting job, every pass: a queue has a few dozen shapes. A named task environment is a label of
    # the hosts that can run it (orchestrator/environments/availability.py); "" (the agents' own interpreter) any.
    plain = frozenset(parse_labels(labels)) if labels else frozenset()
    return JobShape(
        strategy=Strategy(strategy),
        workers=workers,
        ps=ps,
        devices_per_worker=devices_per_worker,
        labels=plain | {availability.label(environment)} if environment else plain,
    )


def packing_of(cluster: Cluster) -> Packing:
    return Packing(cluster.packing)


def plan(job: Job) -> placement.Placement | placement.Unplaceable:
    """Where the job would run now, without writing anything."""
    hosts = fleet_state.host_states(fleet_state.placement_hosts(job.cluster_id))
    return placement.place(job_shape(job), hosts, packing=packing_of(job.cluster))


def plan_on_empty_cluster(job: Job) -> placement.Placement | placement.Unplaceable:
    hosts = fleet_state.host_states(fleet_state.placement_hosts(job.cluster_id), empty=True)
    return placement.place(job_shape(job), hosts, packing=packing_of(job.cluster))


def tf_configs(job: Job, where: placement.Placement) -> dict[tuple[str, int], dict | None]:
    return tf_config.tf_configs_for(where, Strategy(job.strategy))


WAITING_STATES = queueing.WAITING_STATES


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
        waiting = queueing.queued(cluster.pk)
        if not waiting:
            return []
        now = timezone.now()  # the pass's one clock: its reservations count from the placements it writes
        fleet = fleet_state.read(cluster, now)
        placed = _plan_pass(cluster, waiting, fleet, now)
        started = _start(placed, fleet.host_ids, now)
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
    fifo = settings.TFDASH_SCHEDULER_POLICY == "fifo"
    classes, default_value = queueing.class_values()
    share = queueing.shares(cluster, (job.owner_id for job in waiting), fleet.usage)
    shapes = {job.pk: job_shape(job) for job in waiting}
    needs = {pk: devices_needed(shape) for pk, shape in shapes.items()}
    queueing.sort_queue(waiting, classes, default_value, share, lambda job: needs[job.pk])
    planner = backfill.Planner(
        fleet.states,
        fleet.gangs,
        now=now.timestamp(),
        depth=1 if fifo else settings.TFDASH_BACKFILL_DEPTH,
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
        if job.pk in stopping:
            # Its previous gang is still being stopped: a new one must not meet the old processes.
            reasons[job.pk] = job.reason or STOPPING_PREVIOUS
            if fifo:
                break
            continue
        outcome = planner.offer(Waiting(job.pk, shapes[job.pk], job.time_limit_s + grace))
        if isinstance(outcome, placement.Placement):
            job.borrowing = share.over(job.owner_id, needs[job.pk])
            share.use(job.owner_id, needs[job.pk])
            placed.append((job, outcome))
        elif fifo and job.pk not in planner.outcome.never:
            break  # strict first come, first served: nothing passes a job that does not fit
    planner.finish(plan_all=_plan_all_due(cluster.pk, waiting))
    _reserved[cluster.pk] = dict(planner.outcome.reservations)
    out = planner.outcome
    log.debug("pass over cluster %s: %d waiting, %d started, %d reserved, %d unplanned, %d left as they were",
              cluster.pk, len(waiting), len(out.started), len(out.reservations), len(out.unplaced),
              len(out.deferred))  # fmt: skip
    by_id = {job.pk: job for job in waiting}
    for job_id, why in planner.outcome.never.items():
        _never(job_id, cluster, why)
    _tell_reservations(planner.outcome.reservations, needs)
    for job_id, unplaced in planner.outcome.unplaced.items():
        reasons[job_id] = WAITING_UNRESERVED if unplaced is None else f"{unplaced.reason}; {WAITING_UNRESERVED}"
    _tell_waiting(by_id, reasons, placed, planner.outcome)
    if not fifo:
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


HELD = "held by staff: it keeps its place and waits until released"
STOPPING_PREVIOUS = "its previous run is being stopped; it is placed again once its processes are gone"
WAITING_UNRESERVED = (
    "waiting: it does not fit now and jobs ahead of it hold the reservations; its start is planned once it is among "
    "the first"
)


def placement_needs(job: Job | queueing.Queued) -> int:
    return devices_needed(job_shape(job))


def _still_stopping(jobs: list[queueing.Queued]) -> set[int]:
    if not jobs:
        return set()
    active = Task.objects.filter(job_id__in=[job.pk for job in jobs], state__in=ACTIVE_TASK_STATES)
    return set(active.values_list("job_id", flat=True))


def _never(job_id: int, cluster: Cluster, why: placement.Unplaceable) -> None:
    # The cluster shrank since the job was accepted: it can never run here now.
    job = Job.objects.select_for_update().filter(pk=job_id, state__in=WAITING_STATES).first()
    if job is None:
        return  # it ended meanwhile (cancelled)
    job.state, job.finished_at = JobState.FAILED, timezone.now()
    job.reason = f"can never run on cluster {cluster.name}: {why.reason}"
    job.save(update_fields=["state", "finished_at", "reason"])


def _tell_reservations(reservations: dict[int, Reservation], needs: dict[int, int]) -> None:
    """A reserved job stores when it starts at the latest and where (the queue view and its page show them)."""
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


def _tell_waiting(
    jobs: dict[int, queueing.Queued],
    reasons: dict[int, str],
    placed: list[tuple[queueing.Queued, placement.Placement]],
    outcome: Outcome,
) -> None:
    """Every other waiting job says why it waits, one UPDATE per distinct reason (most share one), of the rows whose
    reason changes only: no live hint is sent for a reason alone (the job's state did not change). Which rows change
    is judged on what the pass read of them: a pass that plans every start tells the whole queue, and an UPDATE
    matching 2,000 ids to find the few that changed was a tenth of such a pass (bench/pass_cost.py). A row written
    since the read (staff held it, say) is told by the next pass whose reason differs from it."""
    done = {job.pk for job, _where in placed} | set(outcome.reservations) | set(outcome.never) | set(outcome.deferred)
    by_reason: dict[str, list[int]] = defaultdict(list)
    for job_id, job in jobs.items():
        if job_id not in done:
            reason = reasons.get(job_id, WAITING_UNRESERVED)
            if job.reason != reason or job.told_start:
                by_reason[reason].append(job_id)
    for reason, ids in by_reason.items():
        Job.objects.filter(pk__in=ids).update(reason=reason, expected_start=None, reservation={})


def ordered_queue(cluster: Cluster) -> list[Job]:
    """The cluster's waiting jobs in the order a pass walks them (the queue view, a job page's place)."""
    waiting = queueing.queued(cluster.pk)
    classes, default_value = queueing.class_values()
    share = queueing.shares(cluster, (job.owner_id for job in waiting), fleet_state.usage(cluster.pk))
    queueing.sort_queue(waiting, classes, default_value, share, placement_needs)
    rows = Job.objects.select_related("owner", "priority_class").in_bulk([job.pk for job in waiting])
    return [rows[job.pk] for job in waiting if job.pk in rows]


def queue_place(job: Job) -> tuple[int, Job | None]:
    """How many jobs wait ahead of a waiting `job` on its cluster, and the first of them (None when it is first or not
    waiting): the job page says so."""
    if job.state not in WAITING_STATES:
        return 0, None
    queue = ordered_queue(job.cluster)
    ahead = next((i for i, other in enumerate(queue) if other.pk == job.pk), 0)
    return ahead, (queue[0] if ahead else None)


def _start(
    planned: list[tuple[queueing.Queued, placement.Placement]], hosts: dict[str, int], now: datetime
) -> list[int]:
    """Write the pass's placements: every started job in one UPDATE, every task in one INSERT, and their launch orders
    in one batch once the pass commits (a statement per job was most of a pass over a 1,000-job queue). Returns the
    ids of the jobs started. The placed jobs are read whole here, locked: one cancelled or held since the queue was
    read is not started (its devices stay unused until the next pass)."""
    if not planned:
        return []
    where_of = {job.pk: where for job, where in planned}
    borrowing = {job.pk for job, _where in planned if job.borrowing}
    rows_now = Job.objects.select_for_update().filter(pk__in=where_of, state__in=WAITING_STATES, held=False)
    placed = [(job, where_of[job.pk]) for job in rows_now.order_by("pk")]
    if not placed:
        return []
    for job, _where in placed:
        job.borrowing = job.pk in borrowing
    # How often each slot's process was started again: every gang restart, plus the slot's own in-place relaunches
    # (each a row with restart > 0; Job.restarts counts both kinds). A re-placement after a port conflict is neither.
    # Jobs that never restarted have no relaunched slots: no query (the common case).
    restarted = [job.pk for job, _where in placed if job.restarts]
    relaunched: dict[int, Counter[tuple[str, int]]] = defaultdict(Counter)
    for job_id, type_, index in (
        Task.objects.filter(job__in=restarted, restart__gt=0).values_list("job_id", "type", "index")
        if restarted
        else ()
    ):
        relaunched[job_id][(type_, index)] += 1
    rows: list[dict[str, Any]] = []  # the new task rows' values (task_rows.insert_current)
    for job, where in placed:
        job.state_before = job.state  # type: ignore[attr-defined]
        job.attempt += 1
        # After a restart the page keeps saying what it was after.
        job.reason = (
            f"restart {job.restarts} of {job.max_restarts}, after: {job.restart_reason}" if job.restarts else ""
        )
        job.state = JobState.STARTING
        job.placed_at = now
        configs = tf_config.tf_config_texts(where, Strategy(job.strategy))
        gang_restarts = job.restarts - relaunched[job.pk].total()
        rows += [
            {
                "job_id": job.pk,
                "attempt": job.attempt,
                "type": t.type,
                "index": t.index,
                "host_id": hosts[t.host],
                "port": tf_config.task_port(t, job.strategy),
                "devices": list(t.devices),
                "tf_config": None if (text := configs[(t.type, t.index)]) is None else task_rows.JsonText(text),
                "restarts": gang_restarts + relaunched[job.pk][(t.type, t.index)],
                "ordered_at": now,  # its launch goes out on commit
            }
            for t in where.tasks
        ]
        log.info(
            "job %s attempt %s placed: %s",
            job.pk,
            job.attempt,
            ", ".join(f"{t.type}:{t.index}@{t.host}:{t.port}" for t in where.tasks),
        )
    # Jobs placed for the first time (nearly all) in one plain UPDATE (bulk_update's CASE per row cost more than the
    # placement itself); a restarted job keeps its own reason and is saved on its own.
    back = [job for job, _where in placed if job.state_before == JobState.PREEMPTED]
    lifecycle.resumed(back, {job.pk: sorted({t.host for t in where.tasks}) for job, where in placed})
    fresh = [job.pk for job, _where in placed if not job.restarts]
    Job.objects.filter(pk__in=fresh).update(
        attempt=F("attempt") + 1, state=JobState.STARTING, placed_at=now, reason="", expected_start=None,
        reservation={}, borrowing=False,
    )  # fmt: skip
    Job.objects.filter(pk__in=[job.pk for job, _where in placed if job.borrowing]).update(borrowing=True)
    for job, _where in placed:
        if job.restarts:
            job.expected_start, job.reservation = None, {}
            job.save(update_fields=["attempt", "state", "placed_at", "reason", "expected_start", "reservation",
                                    "borrowing"])  # fmt: skip
    ids = task_rows.insert_current(rows)
    live.jobs_changed(fresh)  # an UPDATE sends no post_save: the pages are told here
    dispatch.launch_after_commit(ids)
    return [job.pk for job, _where in placed]


def fits_together(jobs: list[Job], cluster: Cluster) -> str | None:
    """Whether `jobs` could all run at once on the idle cluster (None), or the first that could not, and why."""
    states = fleet_state.host_states(fleet_state.placement_hosts(cluster.pk), empty=True)
    for job in jobs:
        result = placement.place(job_shape(job), states, packing=packing_of(cluster))
        if isinstance(result, placement.Unplaceable):
            return f"{job.variant or job.name}: {result.reason}"
        states = placement.take(states, result)
    return None
