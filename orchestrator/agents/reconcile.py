"""An agent said hello: make the orchestrator's view of its host agree with what really runs there.

A (re)started agent first kills whatever its previous life left running (worker_agent/records.py), then says hello
with a task report: the tasks it runs now and the ones it reclaimed. From that:

- a task the orchestrator thinks is active on the host, but which the agent does not run, is over: `lost` (and the
  job goes through its restart policy, as for a lost host), or `killed` when it was being stopped anyway;
- a task the agent runs but the orchestrator does not consider active there (finished, lost, unknown) is killed.

Not judged here: a `pending` task the agent never confirmed (its launch order may still be waiting in the host's
queue, and runs after the hello; if it was lost with the old agent, the job's start-up deadline ends it) unless the
agent reclaimed it; and a task whose STARTED the orchestrator stored after the hello was written (its launch
overtook the hello). Applying a report twice changes nothing: only active tasks are touched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from contracts.protocol import TaskReport
from orchestrator.control import dispatch, lifecycle
from orchestrator.models import ACTIVE_TASK_STATES, Host, Job, Task, TaskState

log = logging.getLogger(__name__)


@dataclass
class Reconciled:
    lost: list[int] = field(default_factory=list)  # task ids marked lost (or killed, when they were stopping)
    killed: list[int] = field(default_factory=list)  # task ids the agent was told to kill


def reconcile_host(host: Host, report: TaskReport, sent_at: float) -> Reconciled:
    """Apply one hello's task report (written by the agent at `sent_at`, wall seconds) to the host's tasks."""
    result = Reconciled()
    running = {(r.task_id, r.attempt) for r in report.running}
    reclaimed = {(r.task_id, r.attempt): r.detail for r in report.reclaimed}
    written_at = datetime.fromtimestamp(sent_at, tz=timezone.get_current_timezone())
    job_ids = set(Task.objects.filter(host=host, state__in=ACTIVE_TASK_STATES).values_list("job_id", flat=True))
    for job_id in sorted(job_ids):
        with transaction.atomic():
            # Job row first, then its tasks: the order every lifecycle handler locks in.
            job = Job.objects.select_for_update().get(pk=job_id)
            tasks = job.tasks.select_for_update().filter(host=host, state__in=ACTIVE_TASK_STATES).select_related("host")
            gone = []
            for task in tasks:
                key = (task.pk, task.attempt)
                if key in running:
                    continue
                if key in reclaimed:
                    gone.append((task, reclaimed[key]))
                elif task.state != TaskState.PENDING and task.started_at is not None and task.started_at < written_at:
                    gone.append((task, f"the agent on {host.name} restarted and no longer runs it"))
            if gone:
                _tasks_gone(job, gone, host)
                result.lost.extend(task.pk for task, _ in gone)
    result.killed = _kill_strays(host, report)
    return result


def _tasks_gone(job: Job, gone: list[tuple[Task, str]], host: Host) -> None:
    """The agent is back, so unlike a lost host a ParameterServer worker may be relaunched in place; a task being
    stopped is where the orchestrator wanted it: killed."""
    for task, detail in gone:
        log.warning("task %s (%s) of job %s is over: %s", task.pk, task.label, job.pk, detail)
    lifecycle.lose_tasks(
        job, gone, f"the agent on {host.name} restarted", host_gone=False, stopping_as=TaskState.KILLED
    )


def _kill_strays(host: Host, report: TaskReport) -> list[int]:
    """Kill orders for what the agent runs but the orchestrator does not consider active on this host."""
    if not report.running:
        return []
    active = set(
        Task.objects.filter(
            host=host, state__in=ACTIVE_TASK_STATES, pk__in=[r.task_id for r in report.running]
        ).values_list("pk", "attempt")
    )
    # Unsaved rows carrying just what a kill order needs: the task may not exist any more at all.
    strays = [
        Task(pk=r.task_id, job_id=r.job_id, attempt=r.attempt, host=host)
        for r in report.running
        if (r.task_id, r.attempt) not in active
    ]
    if strays:
        log.warning("agent on %s runs tasks %s that are not active there: killing them", host, [t.pk for t in strays])
        transaction.on_commit(lambda: dispatch.kill_tasks(strays, "not active on this host (reconciled on hello)"))
    return [t.pk for t in strays]
