"""A host speaks only for its own tasks: a report (hello, heartbeat, task event, metrics, logs, artifact) that names a
task placed on another host changes nothing for that task; it is logged and counted here, in one place.

Like Kubernetes' NodeRestriction: a kubelet's credential writes its own node's pods' status, no other's. The callers
already touch only the reporting host's rows; this is what tells a forged or confused report from an unknown task.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from orchestrator.models import Host, Task
from orchestrator.plumbing import counters

log = logging.getLogger(__name__)

OTHER_HOSTS_TASKS = "reports_naming_other_hosts_tasks"
LOGGED_IDS = 20


def placed_elsewhere(host: Host, task_ids: Collection[int]) -> list[int]:
    """Those of `task_ids` that are tasks placed on a host other than `host` (one query; none when `task_ids` is)."""
    if not task_ids:
        return []
    return sorted(
        Task.objects.filter(pk__in=task_ids, host__isnull=False).exclude(host=host).values_list("pk", flat=True)
    )


def noted(host: Host, what: str, task_ids: list[int]) -> None:
    """Log and count a report of `host`'s (`what`: "heartbeat", "task event", ...) that names other hosts' tasks."""
    log.warning(
        "%s from %s names task(s) %s placed on another host: nothing changes for them",
        what,
        host.name,
        task_ids[:LOGGED_IDS],
    )
    counters.incr(OTHER_HOSTS_TASKS)
