"""A job as placement sees it (its shape, its cluster's packing) and the plans that write nothing: where it would run
now, where on its cluster idle, its TF_CONFIGs there, the devices it needs, and whether a set of jobs fits the idle
cluster together (submission's plan, an experiment's check, the queue view)."""

from __future__ import annotations

from functools import lru_cache

from contracts.strategies import Strategy
from orchestrator.core import placement, tf_config
from orchestrator.core.assignment import Packing
from orchestrator.core.shapes import JobShape, devices_needed
from orchestrator.environments import availability
from orchestrator.models import Cluster, Job
from orchestrator.models.validators import parse_labels
from orchestrator.scheduler import fleet_state, queueing


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


def placement_needs(job: Job | queueing.Queued) -> int:
    return devices_needed(job_shape(job))


def fits_together(jobs: list[Job], cluster: Cluster) -> str | None:
    """Whether `jobs` could all run at once on the idle cluster (None), or the first that could not, and why."""
    states = fleet_state.host_states(fleet_state.placement_hosts(cluster.pk), empty=True)
    for job in jobs:
        result = placement.place(job_shape(job), states, packing=packing_of(cluster))
        if isinstance(result, placement.Unplaceable):
            return f"{job.variant or job.name}: {result.reason}"
        states = placement.take(states, result)
    return None
