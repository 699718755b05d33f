"""FIFO gang scheduling of queued jobs onto a cluster: rows in, `placement.place`, task rows and launch orders out.

One scheduler pass per cluster at a time (the cluster row is locked for the whole pass; the orchestrator's passes
that find it locked end at once, the running one or the watchdog's next reads the queue afresh), so two passes, in
two threads or two orchestrator workers, never hand out the same port or device. Strict FIFO: a job that does not
fit holds back the jobs behind it, so a big job is not starved by a stream of small ones.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from orchestrator import counters
from orchestrator.control import dispatch, passes
from orchestrator.core import placement, tf_config
from orchestrator.metrics import live
from orchestrator.models import (
    ACTIVE_TASK_STATES,
    Cluster,
    Host,
    HostPortBlock,
    HostStatus,
    Job,
    JobState,
    Task,
    clusters,
)
from orchestrator.models.validators import parse_labels

log = logging.getLogger(__name__)


def job_shape(job: Job) -> placement.JobShape:
    return placement.JobShape(
        strategy=placement.Strategy(job.strategy),
        workers=job.workers,
        ps=job.ps,
        devices_per_worker=job.devices_per_worker,
        labels=frozenset(parse_labels(job.labels)) if job.labels else frozenset(),
    )


class PlacementHost(NamedTuple):
    """What placement reads of a host. A pass loads every host of the cluster: as tuples, because 500 model
    instances were a fifth of a small pass on a busy fleet (bench/pass_cost.py)."""

    pk: int
    name: str
    address: str
    port_min: int
    port_max: int
    gpus: list[Any]
    cpu_slots: int | None
    cpu_count: int | None
    labels: str
    status: str

    @property
    def device_slots(self) -> int:
        return clusters.device_slots(self.gpus, self.cpu_slots, self.cpu_count)

    @property
    def label_set(self) -> frozenset[str]:
        return clusters.label_set(self.labels)


# A host row as placement reads it: the model (a page's hosts) or the tuple (a pass's).
HostRow = Host | PlacementHost


def host_device_ids(host: HostRow) -> tuple[tuple[int, ...], bool]:
    if host.gpus:
        return tuple(int(g["index"]) for g in host.gpus), True
    return tuple(range(host.device_slots)), False


def placement_hosts(cluster_id: int) -> list[PlacementHost]:
    """The cluster's hosts, with only what placement reads of them."""
    rows = Host.objects.filter(cluster_id=cluster_id).order_by().values_list(*PlacementHost._fields)
    return [PlacementHost._make(row) for row in rows]


def host_states(hosts: Iterable[HostRow], *, empty: bool = False) -> list[placement.HostState]:
    """What placement needs to know of each host now (or, with `empty`, as if every host were up and idle)."""
    hosts = list(hosts)
    used_ports: dict[int, set[int]] = defaultdict(set)
    used_devices: dict[int, set[int]] = defaultdict(set)
    blocked: dict[int, set[int]] = defaultdict(set)
    if not empty:
        ids = [host.pk for host in hosts]
        for host_id, ports, devices in _in_use(ids):
            used_ports[host_id].update(ports or ())
            used_devices[host_id].update(devices or ())
        blocks = HostPortBlock.objects.filter(host_id__in=ids, until__gt=timezone.now()).order_by()
        for host_id, port in blocks.values_list("host_id", "port"):
            blocked[host_id].add(port)
    states = []
    for host in hosts:
        device_ids, gpu = host_device_ids(host)
        states.append(
            placement.HostState(
                name=host.name,
                address=host.address,
                port_min=host.port_min,
                port_max=host.port_max,
                device_ids=device_ids,
                gpu=gpu,
                labels=host.label_set,
                online=empty or host.status == HostStatus.ONLINE,
                used_devices=frozenset(used_devices[host.pk]),
                used_ports=frozenset(used_ports[host.pk]),
                excluded_ports=frozenset(blocked[host.pk]),
            )
        )
    return states


def _in_use(host_ids: list[int]) -> list[tuple[int, list[int] | None, list[int] | None]]:
    """(host id, ports, devices) held by the active tasks on these hosts, one row per host. Aggregated by PostgreSQL:
    a pass over a busy fleet read every active task (4,000 rows, each a JSON list to decode, in the tasks' default
    order) and that was a third of a small pass (bench/pass_cost.py)."""
    sql = f"""
        SELECT t.host_id,
               array_agg(DISTINCT t.port) FILTER (WHERE t.port IS NOT NULL),
               array_agg(DISTINCT d.device::int) FILTER (WHERE d.device IS NOT NULL)
        FROM {Task._meta.db_table} t
        LEFT JOIN LATERAL jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(t.devices) = 'array' THEN t.devices ELSE '[]'::jsonb END
        ) AS d(device) ON true
        WHERE t.host_id = ANY(%s) AND t.state = ANY(%s)
        GROUP BY t.host_id
    """  # noqa: S608 - a table name from the model, every value a parameter
    with connection.cursor() as cursor:
        cursor.execute(sql, [host_ids, [str(state) for state in ACTIVE_TASK_STATES]])
        return cursor.fetchall()


def plan(job: Job) -> placement.Placement | placement.Unplaceable:
    """Where the job would run now, without writing anything."""
    return placement.place(job_shape(job), host_states(placement_hosts(job.cluster_id)))


def plan_on_empty_cluster(job: Job) -> placement.Placement | placement.Unplaceable:
    return placement.place(job_shape(job), host_states(placement_hosts(job.cluster_id), empty=True))


def tf_configs(job: Job, where: placement.Placement) -> dict[tuple[str, int], dict | None]:
    return tf_config.tf_configs_for(where, placement.Strategy(job.strategy))


WAITING_STATES = (JobState.QUEUED, JobState.RESTARTING)


PASS_TIME = "scheduler_pass_s"  # noqa: S105 - a counter name; counters.observe: each pass (GET /metrics)


def schedule_cluster(cluster_id: int, *, wait: bool = True) -> list[int]:
    """Start every queued job of the cluster that fits, in FIFO order; returns the ids of jobs started. `wait`
    False (the orchestrator's passes): when another pass holds the cluster, end at once (see below)."""
    began = time.perf_counter()
    try:
        return _pass(cluster_id, wait=wait)
    finally:
        counters.observe(PASS_TIME, time.perf_counter() - began)


def _pass(cluster_id: int, *, wait: bool) -> list[int]:
    started: list[int] = []
    began = time.perf_counter()
    passes.pass_begins(cluster_id)
    with transaction.atomic():
        # Not waiting (skip_locked): when another pass (another thread or orchestrator worker) holds the cluster,
        # this one has nothing to add; it began after this ask was made, or the watchdog's next tick (every second
        # while jobs wait) covers it. Waiting tied up a worker thread per blocked pass, and with them the heartbeats
        # that worker had already taken from the queue (suspected: hosts declared lost while their reports sat there).
        cluster = Cluster.objects.select_for_update(skip_locked=not wait).filter(pk=cluster_id).first()
        if cluster is None:
            if Cluster.objects.filter(pk=cluster_id).exists():
                log.debug("cluster %s: a scheduler pass is already running", cluster_id)
            return started
        queue = _queue(cluster)
        head = next(queue, None)
        if head is None:
            return started
        rows = placement_hosts(cluster.pk)
        hosts = {h.name: h.pk for h in rows}
        states = host_states(rows)
        blocked_by: Job | None = None
        placed: list[tuple[Job, placement.Placement]] = []  # written together at the end of the pass
        fits_empty: set[placement.JobShape] = set()  # shapes already known to fit the idle cluster, this pass
        for job in itertools.chain([head], queue):
            if job.state == JobState.RESTARTING and job.tasks.filter(state__in=ACTIVE_TASK_STATES).exists():
                # Its previous gang is still being stopped: a new one must not meet the old processes.
                blocked_by = job
                break
            shape = job_shape(job)
            result = placement.place(shape, states, fits_empty=shape in fits_empty)
            if isinstance(result, placement.Unplaceable):
                if result.permanent:
                    # The cluster shrank since the job was accepted: it can never run here now.
                    job.state, job.finished_at = JobState.FAILED, timezone.now()
                    job.reason = f"can never run on cluster {cluster.name}: {result.reason}"
                    job.save(update_fields=["state", "finished_at", "reason"])
                    continue
                if job.state == JobState.RESTARTING:
                    # Its gang is gone and it does not fit now (a host was lost): queued, saying why.
                    job.state = JobState.QUEUED
                    job.save(update_fields=["state"])
                reason = result.reason
                if job.restarts:
                    reason += f" (restart {job.restarts} of {job.max_restarts}, after: {job.restart_reason})"
                _set_reason(job, reason)
                blocked_by = job
                break
            fits_empty.add(shape)
            placed.append((job, result))
            states = take(states, result)
            started.append(job.pk)
        _start(placed, hosts)
        if blocked_by is not None:
            _wait_behind(blocked_by)
    if placed:  # committed (bench/scale.py reads these lines: placement throughput)
        log.info("scheduler pass over cluster %s placed %d task(s) of %d job(s) in %.4f s", cluster_id,
                 sum(len(where.tasks) for _job, where in placed), len(placed), time.perf_counter() - began)  # fmt: skip
    return started


QUEUE_CHUNKS = (20, 200)  # the first read, then every later one


QUEUE_ORDER = ("created_at", "id")  # a restarting job keeps its place (created_at), ahead of later submissions


def _behind(job: Job) -> Q:
    """The jobs after `job` in queue order."""
    return Q(created_at__gt=job.created_at) | Q(created_at=job.created_at, id__gt=job.pk)


def _ahead(job: Job) -> Q:
    return Q(created_at__lt=job.created_at) | Q(created_at=job.created_at, id__lt=job.pk)


def queue_place(job: Job) -> tuple[int, Job | None]:
    """How many jobs wait ahead of a waiting `job` on its cluster, and the first of them (None when it is first or not
    waiting): the job page says so, since the reason of the jobs behind the head does not name it."""
    if job.state not in WAITING_STATES:
        return 0, None
    ahead = Job.objects.filter(_ahead(job), cluster_id=job.cluster_id, state__in=WAITING_STATES)
    count = ahead.count()
    return count, (ahead.order_by(*QUEUE_ORDER).only("pk", "reason").first() if count else None)


def _queue(cluster: Cluster) -> Iterator[Job]:
    """The cluster's waiting jobs in queue order, read a chunk at a time: a pass usually stops at a job that does not
    fit, and the rows behind it are then never read (one UPDATE tells them why they wait: `_wait_behind`). The first
    chunk is small: on a busy fleet most passes stop at the head."""
    jobs = Job.objects.filter(cluster=cluster, state__in=WAITING_STATES).order_by(*QUEUE_ORDER)
    after: Job | None = None
    while True:
        size = QUEUE_CHUNKS[after is not None]
        chunk = list((jobs.filter(_behind(after)) if after is not None else jobs)[:size])
        yield from chunk
        if len(chunk) < size:
            return
        after = chunk[-1]


WAITING_BEHIND = "waiting behind earlier jobs in the queue (first come, first served): the first does not fit yet"


def _wait_behind(head: Job) -> None:
    """Every job queued behind `head` says why it waits, in one UPDATE of the rows whose reason is another; no live
    hint is sent for a reason alone (the job's state did not change). The text does not name the head (as Slurm's
    "Priority" reason does not): it then changes only for newly queued jobs, where naming the head rewrote every
    queued row each time the head was placed (800 rows, a third of a small pass on a busy fleet)."""
    reason = WAITING_BEHIND
    behind = Job.objects.filter(_behind(head), cluster_id=head.cluster_id, state__in=WAITING_STATES)
    behind.exclude(reason=reason).update(reason=reason)


def _set_reason(job: Job, reason: str) -> None:
    if job.reason != reason:
        job.reason = reason
        job.save(update_fields=["reason"])


def take(states: list[placement.HostState], where: placement.Placement) -> list[placement.HostState]:
    """Host states with a freshly placed job's ports and devices marked used, for the next job in this pass."""
    by_host: dict[str, list[placement.TaskPlacement]] = defaultdict(list)
    for task in where.tasks:
        by_host[task.host].append(task)
    # Only the hosts the job landed on change: the others are kept as they are (a pass over 1,000 jobs on 500 hosts
    # would otherwise copy every host's state once per job).
    return [
        state.with_used((t.port for t in by_host[state.name]), (d for t in by_host[state.name] for d in t.devices))
        if state.name in by_host
        else state
        for state in states
    ]


def _start(placed: list[tuple[Job, placement.Placement]], hosts: dict[str, int]) -> None:
    """Write the pass's placements: every started job in one UPDATE, every task in one INSERT, and their launch orders
    in one batch once the pass commits (a statement per job was most of a pass over a 1,000-job queue)."""
    if not placed:
        return
    now = timezone.now()
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
    rows: list[Task] = []
    for job, where in placed:
        job.attempt += 1
        # After a restart the page keeps saying what it was after.
        job.reason = (
            f"restart {job.restarts} of {job.max_restarts}, after: {job.restart_reason}" if job.restarts else ""
        )
        job.state = JobState.STARTING
        job.placed_at = now
        configs = tf_configs(job, where)
        gang_restarts = job.restarts - relaunched[job.pk].total()
        rows += [
            Task(
                job=job,
                attempt=job.attempt,
                type=t.type,
                index=t.index,
                host_id=hosts[t.host],
                port=tf_config.task_port(t, job.strategy),
                devices=list(t.devices),
                tf_config=configs[(t.type, t.index)],
                restarts=gang_restarts + relaunched[job.pk][(t.type, t.index)],
                ordered_at=now,  # its launch goes out on commit
            )
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
    fresh = [job.pk for job, _where in placed if not job.restarts]
    Job.objects.filter(pk__in=fresh).update(attempt=F("attempt") + 1, state=JobState.STARTING, placed_at=now, reason="")
    for job, _where in placed:
        if job.restarts:
            job.save(update_fields=["attempt", "state", "placed_at", "reason"])
    ids = [task.pk for task in Task.objects.bulk_create(rows, batch_size=1000)]
    live.jobs_changed(fresh)  # an UPDATE sends no post_save: the pages are told here
    dispatch.launch_after_commit(ids)


def fits_together(jobs: list[Job], cluster: Cluster) -> str | None:
    """Whether `jobs` could all run at once on the idle cluster (None), or the first that could not, and why."""
    states = host_states(placement_hosts(cluster.pk), empty=True)
    for job in jobs:
        result = placement.place(job_shape(job), states)
        if isinstance(result, placement.Unplaceable):
            return f"{job.variant or job.name}: {result.reason}"
        states = take(states, result)
    return None
