"""The fleet as a scheduler pass reads it: each host's fixed facts and what is in use on it now, the gangs holding
devices and when they let them go, and the states a pass updates as it places. Rows in, plain placement states out
(orchestrator/core/placement.py, orchestrator/core/backfill.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any, NamedTuple

from django.db import connection
from django.utils import timezone

from orchestrator.core import backfill, placement
from orchestrator.models import (
    ACTIVE_TASK_STATES,
    Cluster,
    Host,
    HostPortBlock,
    HostStatus,
    Job,
    Task,
    TaskState,
    clusters,
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


def running_gangs(cluster: Cluster, now: Any) -> tuple[list[backfill.Running], dict[int, int]]:
    """Every gang holding devices on the cluster, with when it lets them go at the latest: its placement plus its time
    limit plus the stop grace (the watchdog stops it there), or, already being stopped, the grace from now; and the
    devices each owner holds (fair share), from the same rows."""
    sql = f"""
        SELECT t.job_id, h.name, j.placed_at, j.time_limit_s, bool_or(t.state = %s),
               array_agg(DISTINCT d.device::int) FILTER (WHERE d.device IS NOT NULL), j.owner_id
        FROM {Task._meta.db_table} t
        JOIN {Host._meta.db_table} h ON h.id = t.host_id
        JOIN {Job._meta.db_table} j ON j.id = t.job_id
        LEFT JOIN LATERAL jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(t.devices) = 'array' THEN t.devices ELSE '[]'::jsonb END
        ) AS d(device) ON true
        WHERE h.cluster_id = %s AND t.state = ANY(%s)
        GROUP BY t.job_id, h.name, j.placed_at, j.time_limit_s, j.owner_id
    """  # noqa: S608 - table names from the models, every value a parameter
    grace = cluster.stop_grace_s
    soonest = now.timestamp() + grace  # a gang past its limit, or being stopped, is gone within the grace
    ends: dict[int, float] = {}
    held: dict[int, dict[str, frozenset[int]]] = defaultdict(dict)
    usage: dict[int, int] = defaultdict(int)
    with connection.cursor() as cursor:
        cursor.execute(sql, [str(TaskState.STOPPING), cluster.pk, [str(state) for state in ACTIVE_TASK_STATES]])
        for job_id, host, placed_at, limit, stopping, devices, owner_id in cursor.fetchall():
            end = soonest if stopping or placed_at is None else max(soonest, placed_at.timestamp() + limit + grace)
            ends[job_id] = max(ends.get(job_id, 0.0), end)
            held[job_id][host] = frozenset(devices or ())
            usage[owner_id] += len(devices or ())
    return [backfill.Running(job_id, ends[job_id], held[job_id]) for job_id in ends], dict(usage)
