"""What a scheduler pass writes for the jobs it starts (`start`): the job rows (STARTING, a new attempt), their task
rows by COPY, and their launch orders once the pass commits. Called by orchestrator/scheduler/scheduling.py inside the
pass's transaction, with the cluster locked."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from django.db.models import F

from contracts.strategies import Strategy
from orchestrator.core import placement, preflight, tf_config
from orchestrator.jobs import dispatch, lifecycle
from orchestrator.metrics import live
from orchestrator.models import Job, JobState, Task
from orchestrator.scheduler import queueing, task_rows
from orchestrator.scheduler.queueing import WAITING_STATES

log = logging.getLogger(__name__)


def start(
    planned: list[tuple[queueing.Queued, placement.Placement]], hosts: dict[str, int], now: datetime
) -> list[int]:
    """Write the pass's placements: every started job in one UPDATE, every task in one INSERT, and their launch orders
    in one batch once the pass commits (a statement per job was most of a pass over a 1,000-job queue). Returns the
    ids of the jobs started. The placed jobs are read whole here, locked: one cancelled, held or waiting for a
    preflight since the queue was read is not started (its devices stay unused until the next pass)."""
    if not planned:
        return []
    where_of = {job.pk: where for job, where in planned}
    borrowing = {job.pk for job, _where in planned if job.borrowing}
    rows_now = Job.objects.select_for_update().filter(pk__in=where_of, state__in=WAITING_STATES, held=False)
    # Not one whose preflight started since the read (containment: a row without the key is no NULL to exclude).
    rows_now = rows_now.exclude(preflight__contains={"state": preflight.RUNNING})
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
                "placed_at": now,  # its devices are held from now (orchestrator/usage/)
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
