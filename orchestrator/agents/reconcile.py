"""Every hello and heartbeat: make the orchestrator's view of a host agree with what its agent reports.

Level-triggered, like a Kubernetes controller: each report carries the agent's whole truth (the task processes it
runs, the exits it recorded and has not had acknowledged, the number of its last event; see TaskReport), and each
one is compared with the database afresh, so a lost event or order is made good by the next beat and a report
applied twice, or late, changes nothing wrong. For each task of the host:

- a recorded exit of an active task ends it, as its EXITED event would have (`lost` exits as a lost task); every
  exit the database now holds as final is acknowledged, so the agent forgets it;
- an active task the agent neither runs nor recorded, in a report written after the newest event applied to it
  (`events_upto >= task.event_seq`), has no process any more: it is lost (or killed, if it was being stopped). A
  report older than what the orchestrator knows of the task judges nothing;
- a task never heard of (pending, or stopped before it started) whose order went out more than `resend_after` ago
  gets it again: its launch (the agent applies a launch once per attempt), or a kill, after which the agent records
  it as over without ever starting it;
- a stopping task the agent still runs gets its kill again after `resend_after`;
- a process the agent runs that is not an active task of this host (finished, lost, unknown) is killed there; that
  kill stamps no row (the task may be another host's now, whose orders must not look answered).

A host speaks only for its own tasks: only this host's rows are compared, so a report naming another host's task
(running or exited) changes nothing for it; such a report is logged and counted (orchestrator/identity/foreign.py).

Judging never needs the two machines' clocks to agree: it compares the agent's own event numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from contracts.host_reports import RecordedExit, TaskReport
from orchestrator.agents import events
from orchestrator.identity import foreign
from orchestrator.jobs import dispatch, restarts
from orchestrator.models import ACTIVE_TASK_STATES, Host, Job, Task, TaskState
from orchestrator.models.row_locks import tasks_locked
from orchestrator.plumbing import counters
from orchestrator.plumbing.compiled_writes import save_fields

log = logging.getLogger(__name__)

ORDERS_RESENT = "orders_resent"  # launch and kill orders sent again (GET /metrics)

Key = tuple[int, int]  # (task_id, attempt)


@dataclass
class Converged:
    ended: list[int] = field(default_factory=list)  # ended by a recorded exit
    lost: list[int] = field(default_factory=list)  # process gone with nothing recorded
    killed: list[int] = field(default_factory=list)  # stray processes told to die
    resent: list[int] = field(default_factory=list)  # launch or kill orders sent again
    acknowledged: list[Key] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.ended or self.lost or self.killed or self.resent)


def _named(report: TaskReport) -> set[int]:
    return {r.task_id for r in report.running} | {e.task_id for e in report.exits}


def rows_of(reports: list[tuple[Host, TaskReport]]) -> dict[int, dict[Key, Task]]:
    """Per host id, the rows `converge` compares its report with: the host's active tasks and the tasks its report
    names. One query for a whole batch of reports."""
    if not reports:
        return {}
    hosts = {host.pk: host for host, _report in reports}
    named = {host.pk: _named(report) for host, report in reports}
    found: dict[int, dict[Key, Task]] = {pk: {} for pk in hosts}
    query = (
        Task.objects.filter(host__in=list(hosts))
        .filter(Q(state__in=ACTIVE_TASK_STATES) | Q(pk__in=set().union(*named.values())))
        .order_by()  # a dict: the model's ordering would only add a sort to every heartbeat
    )
    for task in query:
        assert task.host_id is not None
        if task.state in ACTIVE_TASK_STATES or task.pk in named[task.host_id]:
            task.host = hosts[task.host_id]
            found[task.host_id][(task.pk, task.attempt)] = task
    return found


def converge(host: Host, report: TaskReport, rows: dict[Key, Task] | None = None) -> Converged:
    """`rows`: the host's rows as `rows_of` reads them, when the caller read a batch's at once."""
    result = Converged()
    running = {(r.task_id, r.attempt) for r in report.running}
    exits = {(e.task_id, e.attempt): e for e in report.exits}
    if rows is None:
        rows = rows_of([(host, report)])[host.pk]
    resend_before = timezone.now() - timedelta(seconds=settings.TFDASH_ORDER_RESEND_S)
    to_end: dict[int, list[Key]] = {}  # job id -> tasks to settle under the job's lock
    relaunch, rekill = [], []
    for key, task in rows.items():
        if task.state not in ACTIVE_TASK_STATES:
            continue
        if key in exits:
            to_end.setdefault(task.job_id, []).append(key)
        elif key in running:
            if task.state == TaskState.STOPPING and _order_unanswered(task, resend_before):
                rekill.append(task)
        elif task.event_seq:
            if task.event_seq <= report.events_upto:
                to_end.setdefault(task.job_id, []).append(key)
        elif _order_unanswered(task, resend_before):
            (rekill if task.state == TaskState.STOPPING else relaunch).append(task)
    unknown_here = _named(report) - {task_id for task_id, _attempt in rows}
    if elsewhere := foreign.placed_elsewhere(host, unknown_here):
        foreign.noted(host, "a report", elsewhere)
    for job_id, keys in sorted(to_end.items()):
        _settle(job_id, keys, exits, report.events_upto, host, result)
    # Every exit the database now holds as final (or that names nothing here): the agent may forget it.
    result.acknowledged = [
        key for key in exits if key not in rows or key[0] in result.ended or rows[key].state not in ACTIVE_TASK_STATES
    ]
    strays = [
        Task(pk=r.task_id, job_id=r.job_id, attempt=r.attempt, host=host)
        for r in report.running
        if (r.task_id, r.attempt) not in rows or rows[(r.task_id, r.attempt)].state not in ACTIVE_TASK_STATES
    ]
    _send_orders(host, result, relaunch, rekill, strays)
    if result.changed:
        log.warning(
            "converged %s: ended %s, lost %s, killed strays %s, resent orders for %s",
            host.name, result.ended, result.lost, result.killed, result.resent,
        )  # fmt: skip
    return result


def _order_unanswered(task: Task, resend_before: datetime) -> bool:
    return task.ordered_at is None or task.ordered_at < resend_before


def _settle(
    job_id: int, keys: list[Key], exits: dict[Key, RecordedExit], events_upto: int, host: Host, result: Converged
) -> None:
    """End the job's tasks that the report shows are over, rechecked under the job's and the tasks' locks."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        tasks = tasks_locked(job.tasks.filter(pk__in=[k[0] for k in keys]).select_related("host"))
        gone, restarted = [], False
        for task in tasks:
            key = (task.pk, task.attempt)
            if task.state not in ACTIVE_TASK_STATES or key not in keys:
                continue  # settled meanwhile (its event arrived)
            task.job = job  # the locked row
            recorded = exits.get(key)
            if recorded is not None and events.lines_missing(task, recorded.lines):
                events.wait_for_lines(task, recorded.as_event())  # a final task has its whole log
                if not events.waited_enough(task):
                    continue
            if recorded is not None and not recorded.lost:
                _apply_exit(task, recorded)
                result.ended.append(task.pk)
            elif recorded is not None:  # only a restarted agent records an exit as lost (it reclaimed the task)
                if task.exit_waiting is not None:
                    task.exit_waiting = None
                    save_fields(task, ["exit_waiting"])
                gone.append((task, recorded.detail or f"the agent on {host.name} restarted"))
                restarted = True
                result.ended.append(task.pk)
            elif task.event_seq and task.event_seq <= events_upto:
                gone.append((task, f"the agent on {host.name} no longer runs it and recorded no exit"))
                result.lost.append(task.pk)
        if gone:
            for task, detail in gone:
                log.warning("task %s (%s) of job %s is over: %s", task.pk, task.label, job.pk, detail)
            why = "restarted" if restarted else "no longer runs them"
            restarts.lose_tasks(
                job, gone, f"the agent on {host.name} {why}", host_gone=False, stopping_as=TaskState.KILLED
            )


def _apply_exit(task: Task, recorded: RecordedExit) -> None:
    """The recorded exit is the truth about a process that is over: applied even if its number is not newer."""
    events.apply_waited(task, recorded.as_event())


def _send_orders(host: Host, result: Converged, relaunch: list[Task], rekill: list[Task], strays: list[Task]) -> None:
    """After the settling transactions committed: orders name only what is stored."""
    if relaunch:
        dispatch.launch_tasks([t.pk for t in relaunch])
    if rekill:
        dispatch.kill_tasks(rekill, "stopping (order sent again)")
    result.resent = [t.pk for t in relaunch + rekill]
    if result.resent:
        counters.incr(ORDERS_RESENT, len(result.resent))
    if strays:
        # Unstamped: a stray may be an old attempt of a task placed elsewhere now, or named by a forged report.
        dispatch.kill_tasks(strays, "not an active task of this host", stamp=False)
        result.killed = [t.pk for t in strays]
    dispatch.acknowledge_exits(host, result.acknowledged)
