"""The fleet as a scheduler pass reads it: each host's fixed facts and what is in use on it now, the gangs holding
devices and when they let them go, and the states a pass updates as it places. Rows in, plain placement states out
(orchestrator/core/placement.py, orchestrator/core/backfill.py)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection
from django.utils import timezone

from orchestrator.core import backfill_terms
from orchestrator.core.hosts import HostState
from orchestrator.environments import availability
from orchestrator.models import Cluster, Host, HostPortBlock, HostStatus, TaskEnvironment, clusters
from orchestrator.scheduler import active_tasks


class PlacementHost(NamedTuple):
    """What placement reads of a host. A pass loads every host of the cluster: as tuples, because 500 model
    instances were a fifth of a small pass on a busy fleet (bench/pass_cost.py)."""

    pk: int
    name: str
    address: str
    port_min: int
    port_max: int
    gpu_indexes: list[Any]  # each GPU's `index` as the host's facts hold it (None: no GPU list)
    cpu_slots: int | None
    cpu_count: int | None
    labels: str
    status: str
    # `env:<name>` of each task environment the host can run (orchestrator/environments/availability.py).
    environments: frozenset[str] = frozenset()

    @property
    def device_slots(self) -> int:
        return clusters.device_slots(self.gpu_indexes, self.cpu_slots, self.cpu_count)

    @property
    def label_set(self) -> frozenset[str]:
        return clusters.label_set(self.labels) | self.environments


def placement_host(host: Host, registered: dict[str, str] | None = None) -> PlacementHost:
    """A host's model as placement reads it (a page's hosts): what `placement_hosts` reads of its row. `registered`:
    its cluster's environments (read when not given)."""
    gpus = host.gpus if isinstance(host.gpus, list) else []
    indexes = [gpu["index"] for gpu in gpus if isinstance(gpu, dict) and "index" in gpu]
    if registered is None:
        registered = registered_environments(host.cluster_id)
    envs = availability.labels(host.environments, registered, bool(indexes))
    return PlacementHost(host.pk, host.name, host.address, host.port_min, host.port_max, indexes, host.cpu_slots,
                         host.cpu_count, host.labels, host.status, envs)  # fmt: skip


def registered_environments(cluster_id: int) -> dict[str, str]:
    """The cluster's task environments, name -> interpreter (a host's report counts only for the interpreter
    registered now)."""
    return dict(TaskEnvironment.objects.filter(cluster_id=cluster_id).values_list("name", "interpreter"))


def host_device_ids(host: PlacementHost) -> tuple[tuple[int, ...], bool]:
    if host.gpu_indexes:
        return tuple(int(index) for index in host.gpu_indexes), True
    return tuple(range(host.device_slots)), False


def placement_hosts(cluster_id: int) -> list[PlacementHost]:
    """The cluster's hosts, with only what placement reads of them, by name. Of the GPU list only the indexes come,
    as the text of a JSON list, parsed once per distinct text (a fleet's hosts share a handful): decoding 500 JSON
    lists was a tenth of a pass, and the whole GPU facts (names, memory, UUIDs) were a third of what a pass read
    from PostgreSQL, every pass. In a stable order: what is kept between passes by the hosts' facts (placement's idle
    verdicts) is keyed by them in order, and heartbeats rewrite host rows, which moves them in the table's own order
    (unordered, every pass on a beating fleet missed that cache: a quarter of its time)."""
    registered = registered_environments(cluster_id)
    with connection.cursor() as cursor:
        cursor.execute(_HOSTS_SQL, [cluster_id])
        hosts = []
        for row in cursor.fetchall():
            gpus = active_tasks.parsed(row[5])
            # Environments only matter once the cluster has some: a cluster without runs everything anywhere.
            envs = availability.labels(active_tasks.parsed(row[10]), registered, bool(gpus)) if registered else None
            hosts.append(PlacementHost(*row[:5], gpus, *row[6:10], envs or frozenset()))
        return hosts


_HOSTS_SQL = f"""
    SELECT id, name, address, port_min, port_max, jsonb_path_query_array(gpus, '$[*].index')::text, cpu_slots,
           cpu_count, labels, status, environments::text
    FROM {Host._meta.db_table} WHERE cluster_id = %s ORDER BY name
"""  # noqa: S608 - a table name from the model, the value a parameter


def host_states(hosts: Iterable[PlacementHost | Host], *, empty: bool = False) -> list[HostState]:
    """What placement needs to know of each host now (or, with `empty`, as if every host were up and idle)."""
    registered: dict[int, dict[str, str]] = {}  # per cluster, read once
    plain: list[PlacementHost] = []
    for host in hosts:
        if isinstance(host, Host):
            if host.cluster_id not in registered:
                registered[host.cluster_id] = registered_environments(host.cluster_id)
            plain.append(placement_host(host, registered[host.cluster_id]))
        else:
            plain.append(host)
    hosts = plain
    if empty:
        return [_state(host, (), (), (), online=True) for host in hosts]
    ids = [host.pk for host in hosts]
    held = active_tasks.tally(active_tasks.read(ids), {host.pk: host.name for host in hosts}, time.time(), 0)
    return _states(hosts, held, _blocked_ports(ids))


class Fleet(NamedTuple):
    """A cluster as a scheduler pass plans on it, from one read of its hosts and active tasks."""

    states: list[HostState]
    host_ids: dict[str, int]  # host name -> pk (placements name hosts; task rows point at them)
    gangs: list[backfill_terms.Running]  # every gang holding devices, and when it lets them go at the latest
    usage: dict[int, int]  # devices each owner's active tasks hold (fair share)
    held_since: dict[int, dict[float, int]]  # each owner's devices by the placement that took them (fair share)


def read(cluster: Cluster, now: datetime) -> Fleet:
    """The cluster's hosts as placement sees them, its running gangs and each owner's use: hosts, active tasks
    (orchestrator/scheduler/active_tasks.py) and blocked ports, a few queries whatever the size of the fleet."""
    hosts = placement_hosts(cluster.pk)
    ids = [host.pk for host in hosts]
    tasks = active_tasks.read(ids, cache_key=cluster.pk)
    names = {host.pk: host.name for host in hosts}
    held = active_tasks.tally(tasks, names, now.timestamp(), release_margin(cluster))
    states = _states(hosts, held, _blocked_ports(ids), kept=_kept.setdefault(cluster.pk, {}))
    return Fleet(states, {host.name: host.pk for host in hosts}, held.gangs, held.usage, held.held_since)


# Per cluster, in this process: each host's state as the last pass read it, and what it was made from. A host whose
# row and use did not change gets the same state again, with what placement computed of it (its free devices, its
# machine, its fixed facts) kept: most hosts, between two passes.
_kept: dict[int, dict[int, tuple[tuple[Any, ...], HostState]]] = {}


def release_margin(cluster: Cluster) -> float:
    """How long after a gang's time limit its devices are counted free at the latest: the stop grace (SIGTERM, then
    SIGKILL), then one scheduling interval before a pass sees them (orchestrator/plumbing/pass_requests.py). A
    reservation planned with it is a start the job gets by, not a time it is late from."""
    return cluster.stop_grace_s + settings.TFDASH_SCHEDULE_INTERVAL_S


def usage(cluster_id: int) -> tuple[dict[int, int], dict[int, dict[float, int]]]:
    """The devices each owner's active tasks hold on the cluster, and since when (fair share; the queue view orders
    by it as a pass does)."""
    names = dict(Host.objects.filter(cluster_id=cluster_id).values_list("pk", "name"))
    held = active_tasks.tally(active_tasks.read(list(names)), names, time.time(), 0)
    return held.usage, held.held_since


def _states(
    hosts: list[PlacementHost],
    held: active_tasks.Held,
    blocked: list[tuple[int, int]],
    kept: dict[int, tuple[tuple[Any, ...], HostState]] | None = None,
) -> list[HostState]:
    excluded: dict[int, list[int]] = defaultdict(list)
    for host_id, port in blocked:
        excluded[host_id].append(port)
    states = []
    for host in hosts:
        ports, devices = frozenset(held.ports.get(host.pk, ())), frozenset(held.devices.get(host.pk, ()))
        made_of = (host, ports, devices, frozenset(excluded.get(host.pk, ())))
        if kept is not None and host.pk in kept and kept[host.pk][0] == made_of:
            states.append(kept[host.pk][1])
            continue
        state = _state(host, ports, devices, made_of[3], online=host.status == HostStatus.ONLINE)
        if kept is not None:
            kept[host.pk] = (made_of, state)
        states.append(state)
    return states


def _state(
    host: PlacementHost,
    used_ports: Iterable[int],
    used_devices: Iterable[int],
    excluded: Iterable[int],
    *,
    online: bool,
) -> HostState:
    device_ids, gpu = host_device_ids(host)
    return HostState(
        name=host.name,
        address=host.address,
        port_min=host.port_min,
        port_max=host.port_max,
        device_ids=device_ids,
        gpu=gpu,
        labels=host.label_set,
        online=online,
        used_devices=frozenset(used_devices),
        used_ports=frozenset(used_ports),
        excluded_ports=frozenset(excluded),
    )


def _blocked_ports(host_ids: list[int]) -> list[tuple[int, int]]:
    """(host id, port) of the ports agents found taken, still avoided."""
    sql = f"SELECT host_id, port FROM {HostPortBlock._meta.db_table} WHERE host_id = ANY(%s) AND until > %s"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, [host_ids, timezone.now()])
        return cursor.fetchall()
