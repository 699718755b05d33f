"""Job.progress kept up to date at ingest: epoch k of N, the step, examples/s and the ETA (orchestrator/core/
progress.py computes them), from the points and facts of the task that speaks for the job (contracts.strategies.
speaks_for_job) in its current attempt.

`update` runs inside the ingest's transaction, after the batch's points and facts are written, for the speaking tasks
the batch brought epoch_end points or facts of, or train windows (those alone at most every MIN_INTERVAL_S per job):
one query for their facts, one for their latest points (each task's last ETA_EPOCHS + 1 epoch_end durations and its
latest train window, read backwards along the points' unique (task, phase, name, step) index), and one UPDATE for all
their jobs. After the commit each job's pages get a "progress" frame with the words to show.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Collection
from typing import Any

from django.db import connection, transaction
from django.db.models import F

from contracts.strategies import speaks_for_job
from orchestrator.core import progress as rules
from orchestrator.metrics import live
from orchestrator.metrics.lookups import lookups
from orchestrator.models import Job, JobState, MetricPoint, Task

# A job's progress is written again for its train windows (step, examples/s) at most this often; an epoch's end or
# new facts write it at once. Measured (100 jobs a batch, 6,100 points): the UPDATE of 100 job rows was 23-67 ms of a
# 225-640 ms store, and train windows come every 0.5 s per task.
MIN_INTERVAL_S = 2.0
_written: dict[int, float] = {}  # job -> when this process last wrote its progress (monotonic)

_POINTS_SQL = f"""
    SELECT t.id, p.phase, p.name, p.step, p.epoch, p.value, p.ts FROM unnest(%s::bigint[]) AS t(id)
    CROSS JOIN LATERAL (
        (SELECT phase, name, step, epoch, value, ts FROM {MetricPoint._meta.db_table}
         WHERE task_id = t.id AND phase = 'epoch_end' AND name = 'epoch_time_s' ORDER BY step DESC LIMIT %s)
        UNION ALL
        (SELECT phase, name, step, epoch, value, ts FROM {MetricPoint._meta.db_table}
         WHERE task_id = t.id AND phase = 'train' AND name = 'steps_per_s' ORDER BY step DESC LIMIT 1)
        UNION ALL
        (SELECT phase, name, step, epoch, value, ts FROM {MetricPoint._meta.db_table}
         WHERE task_id = t.id AND phase = 'train' AND name = 'examples_per_s' ORDER BY step DESC LIMIT 1)
    ) p
"""  # noqa: S608 - the model's table; values are parameters

_UPDATE_SQL = f"""
    UPDATE {Job._meta.db_table} j SET progress = n.progress::jsonb
    FROM unnest(%s::bigint[], %s::text[]) AS n(id, progress) WHERE j.id = n.id
"""  # noqa: S608 - the model's table; values are parameters


def speaks(task: Task) -> bool:
    """Whether `task` is the one whose facts and epochs are its job's (its attempt is checked by `update`)."""
    return (task.type, task.index) == speaks_for_job(task.job.strategy)


def update(windows: Collection[int], due: Collection[int] = ()) -> dict[int, dict[str, Any]]:
    """Recompute the progress of the jobs whose speaking task (current attempt) is among `due` (an epoch ended, facts
    came) or `windows` (train windows only: a job written less than MIN_INTERVAL_S ago by this process waits for a
    later batch); returns it per job. Call inside the ingest's transaction (the job rows are locked already,
    orchestrator/models/row_locks.py)."""
    clock = time.monotonic()
    if len(_written) > 100_000:  # jobs ended long ago must not grow it without bound
        _written.clear()
    candidates: list[int] = []
    for pk in sorted(set(windows) | set(due)):
        task = lookups.task(pk)
        if task is None or not speaks(task):
            continue
        if pk not in due and clock - _written.get(task.job_id, -math.inf) < MIN_INTERVAL_S:
            continue
        _written[task.job_id] = clock
        candidates.append(pk)
    if not candidates:
        return {}
    speakers = {
        pk: (job_id, facts, config, state)
        for pk, job_id, facts, config, state in Task.objects.filter(pk__in=candidates, attempt=F("job__attempt"))
        .order_by()
        .values_list("pk", "job_id", "facts", "job__builtin_config", "job__state")
    }
    if not speakers:
        return {}
    ends, windows = _latest_points(list(speakers))
    now = time.time()
    made: dict[int, dict[str, Any]] = {}
    running = {job_id for job_id, _facts, _config, state in speakers.values() if state == JobState.RUNNING}
    for pk, (job_id, facts, config, _state) in speakers.items():
        asked = config.get("epochs") if isinstance(config, dict) else None
        made[job_id] = rules.compute(rules.run_facts(facts, asked), ends.get(pk, []), windows.get(pk), now)
    jobs = sorted(made)
    with connection.cursor() as cursor:
        cursor.execute(_UPDATE_SQL, [jobs, [json.dumps(made[job]) for job in jobs]])
    transaction.on_commit(lambda: _publish(made, running))
    return made


def _latest_points(task_ids: list[int]) -> tuple[dict[int, list[rules.EpochEnd]], dict[int, rules.Window]]:
    ends: dict[int, list[rules.EpochEnd]] = defaultdict(list)
    train: dict[int, dict[str, tuple[int, int | None, float, float]]] = defaultdict(dict)
    with connection.cursor() as cursor:
        cursor.execute(_POINTS_SQL, [task_ids, rules.ETA_EPOCHS + 1])
        for task_id, phase, name, step, epoch, value, ts in cursor.fetchall():
            if phase == "epoch_end":
                if epoch is not None:
                    ends[task_id].append(rules.EpochEnd(epoch=epoch, step=step, seconds=value, ts=ts))
            else:
                train[task_id][name] = (step, epoch, value, ts)
    windows: dict[int, rules.Window] = {}
    for task_id, named in train.items():
        # Both rates come from one window (the same step); the newer one when a batch carried only one of them.
        step, epoch, _value, ts = max(named.values(), key=lambda row: row[0])
        if epoch is None:
            continue
        rates = {name: row[2] for name, row in named.items() if row[0] == step}
        windows[task_id] = rules.Window(
            epoch=epoch,
            step=step,
            ts=ts,
            steps_per_s=rates.get("steps_per_s"),
            examples_per_s=rates.get("examples_per_s"),
        )
    return dict(ends), windows


def _publish(made: dict[int, dict[str, Any]], running: set[int]) -> None:
    """Each job's new progress to its pages, with the words they show (the ETA as of now, only while it runs)."""
    now = time.time()
    live.publish_each(
        [
            (
                job_id,
                {
                    "type": "progress",
                    "progress": progress,
                    "text": rules.describe(progress, now=now, running=job_id in running),
                },
            )
            for job_id, progress in sorted(made.items())
        ]
    )
