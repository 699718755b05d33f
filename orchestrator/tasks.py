"""Celery entry points on the `orchestrator` queue, the one place they are defined. Thin: each hands its payload to
the module that owns the logic; domain code asks for a scheduler pass by name (orchestrator/control/passes.py)."""

from __future__ import annotations

from typing import Any

from config.celery import app
from contracts.protocol import (
    AGENT_HEARTBEAT,
    AGENT_HELLO,
    TASK_EVENT,
    TASK_LOGS,
)
from orchestrator.agents import events, liveness, reports
from orchestrator.control import lifecycle, passes, scheduling
from orchestrator.control.scheduling import WAITING_STATES
from orchestrator.models import Job


@app.task(name=AGENT_HELLO, ignore_result=True)
def agent_hello(payload: Any) -> None:
    reports.handle_report(payload, hello=True)


@app.task(name=AGENT_HEARTBEAT, ignore_result=True)
def agent_heartbeat(payload: Any) -> None:
    reports.handle_report(payload, hello=False)


@app.task(name=TASK_EVENT, ignore_result=True)
def task_event(payload: Any) -> None:
    events.handle_task_event(payload)


@app.task(name=TASK_LOGS, ignore_result=True)
def task_logs(payload: Any) -> None:
    events.handle_task_logs(payload)


# Metric traffic (TASK_METRICS, HOST_SAMPLES, TASK_ARTIFACT) is not a Celery task: see orchestrator/metrics/stream.py.


@app.task(name=passes.SCHEDULE, ignore_result=True)
def schedule(cluster_id: int) -> None:
    scheduling.schedule_cluster(cluster_id)


@app.task(name="orchestrator.watchdog", ignore_result=True)
def watchdog() -> None:
    """Every tick: silent hosts go offline, jobs past their start-up deadline fail, queued jobs get another look
    (capacity may have come back without any event this process saw)."""
    liveness.mark_silent_hosts_offline()
    lifecycle.check_startup_deadlines()
    lifecycle.reap_finished_jobs()
    lifecycle.check_progress()
    for cluster_id in set(Job.objects.filter(state__in=WAITING_STATES).values_list("cluster_id", flat=True)):
        scheduling.schedule_cluster(cluster_id)
