"""Small builders for test rows (no factory library needed for this few)."""

from __future__ import annotations

import uuid
from typing import Any

from orchestrator.identity import tokens
from orchestrator.models import Cluster, Host, Job, Task


def cluster(name: str = "lab") -> Cluster:
    return Cluster.objects.get_or_create(name=name)[0]


def host(name: str | None = None, *, cluster_name: str = "lab", port_min: int = 24000) -> tuple[Host, str]:
    """A registered host and its plain-text agent token."""
    the_host = Host(
        cluster=cluster(cluster_name),
        name=name or f"h-{uuid.uuid4().hex[:8]}",
        address="127.0.0.1",
        port_min=port_min,
        port_max=port_min + 99,
    )
    token = tokens.issue(the_host)
    return the_host, token


def gang(owner: Any, workers: int) -> list[Task]:
    """A MultiWorkerMirrored built-in job's `workers` pending tasks, on one new host (ports 24000 up, a GPU each)."""
    the_host, _token = host()
    the_host.save()
    job = Job.objects.create(owner=owner, cluster=the_host.cluster, name="j", strategy="multi_worker_mirrored",
                             program_kind="builtin", builtin="digits_mlp", workers=workers)  # fmt: skip
    return [
        Task.objects.create(job=job, type="worker", index=i, host=the_host, port=24000 + i, devices=[i])
        for i in range(workers)
    ]
