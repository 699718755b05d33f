"""What TF processes report through their agents: metric points, facts, log lines, host samples and artifacts, stored
idempotently, in bulk.

`store_reports` takes what the metrics stream consumer drained (often hundreds of reports) and stores every point and
sample of it in one transaction, then pushes one frame per job. Each entry is verified once against cached hosts and
tasks (metrics/lookups.py): a lone report, or a host's bundle of them (contracts/bundles.py), whose reports are then
checked against their tasks without another MAC; points are made and stored in metrics/points.py, artifacts in
metrics/artifacts.py.

A report whose storing raises (anything: bad types, a row the database refuses, a bug) is listed in `Stored.failed`
instead of stopping the run; the stream consumer moves it to the dead letters. Only `transient` errors (database or
Redis unreachable) propagate, so nothing is acknowledged and the same entries are tried again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from django.db import DatabaseError, InterfaceError, OperationalError, transaction
from django.db.models import Q

from contracts.bundles import BUNDLED, HOST_REPORTS, HostReports
from contracts.host_samples import parse_sample
from contracts.limits import MAX_LOG_LINE_CHARS
from contracts.metric_messages import HostSampleBatch, TaskMetricsBatch
from contracts.protocol import HOST_SAMPLES, TASK_ARTIFACT, TASK_LOGS, TASK_METRICS
from contracts.strategies import speaks_for_job
from contracts.task_messages import TaskLogBatch
from orchestrator.identity import auth
from orchestrator.identity.stream_marks import Appended, appended_entries
from orchestrator.metrics import drops, hosts, live, log_store, progress
from orchestrator.metrics.artifacts import handle_task_artifact
from orchestrator.metrics.batch import Batch
from orchestrator.metrics.lookups import DROPPED, body_as, lookups, opened, task_in
from orchestrator.metrics.points import (
    MAX_EVENTS_PER_BATCH,
    count_points,
    count_shed,
    metric_rows,
    upsert_points,
    within_limits,
)
from orchestrator.models import Host, HostSample, Job, JobEvent, Task, TaskLogLine
from orchestrator.models.row_locks import lock_rows
from orchestrator.plumbing import counters

# A verified report: its name, the host that sealed it, when (the agent's clock), its body (not checked yet).
Part = tuple[str, Host, float, Any]

log = logging.getLogger(__name__)

MAX_LOG_LINES = 2000  # per report: an agent sends at most 200 (worker_agent/supervision/output.py)
SAMPLES_REFUSED = "host_samples_refused"
FACTS_OUTDATED = "task_facts_outdated"


@dataclass
class Stored:
    points: int = 0
    samples: int = 0
    artifacts: int = 0
    dropped: int = 0
    lines: int = 0
    # (index in the reports, what it raised): reports that could not be stored, for the dead letters
    failed: list[tuple[int, Exception]] = field(default_factory=list)


# SQLSTATE classes of errors that say nothing about the data: connection, rollback (deadlock), resources, operator
# intervention (shutdown, cancel), system.
_TRANSIENT_SQLSTATE_CLASSES = {"08", "40", "53", "57", "58"}


def transient(exc: BaseException) -> bool:
    """Whether `exc` is the infrastructure failing (retry the same entries later) rather than this data (dead letter).
    Only some OperationalErrors qualify: psycopg files data-driven errors such as "program limit exceeded" there too,
    and retrying those would block the stream forever."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | InterfaceError):
        return True
    if isinstance(exc, OperationalError):
        sqlstate = getattr(exc.__cause__, "sqlstate", None)
        return sqlstate is None or sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES  # no SQLSTATE: the connection broke
    return False


def store_reports(reports: Iterable[tuple[str, Any]], entries: Sequence[tuple[str, bytes]] | None = None) -> Stored:
    """Store a drained run of agent reports (name, envelope): every point and sample in one transaction, then one
    live frame per job. An artifact is stored on its own (it can be large). A report that cannot be trusted is
    dropped and counted; one that raises is listed in `failed`. When the transaction fails, the reports are stored
    one by one, so only the ones the database refuses fail. `entries`: the (host, stream id) each report came in
    (orchestrator/identity/stream_marks.py: its age measured to its append, an entry appended again refused)."""
    reports = list(reports)
    appended, marks = appended_entries(len(reports), entries)
    stored = Stored()
    batch = Batch.empty()
    collected: list[int] = []  # reports with rows in `batch`
    artifacts: list[int] = []
    opened: list[tuple[int, list[Part]]] = []
    for index, (name, payload) in enumerate(reports):
        if name == TASK_ARTIFACT:
            artifacts.append(index)
            continue
        try:
            parts = _open(name, payload, appended[index])
        except Exception as exc:
            _failed(stored, index, name, exc)
            continue
        if parts is None:
            stored.dropped += 1
            continue
        opened.append((index, parts))
    # The tasks the verified reports name, read in one query (a bundle per host of eight tasks, 500 hosts: thousands).
    lookups.prefetch({task for _i, parts in opened for part in parts if (task := _task_id(part[3])) is not None})
    for index, parts in opened:
        for part in parts:  # each into a batch of its own: one that raises halfway adds nothing, and fails alone
            single = Batch.empty()
            try:
                if not _COLLECTORS[part[0]](part, single):
                    stored.dropped += 1
                    continue
            except Exception as exc:
                _failed(stored, index, part[0], exc)
                continue
            batch.add(single)
        collected.append(index)
    try:
        with transaction.atomic():
            _write(batch)
    except Exception as exc:
        if transient(exc):
            raise
        # One bad row (a task deleted meanwhile, a value the database refuses) fails the whole transaction: store
        # report by report, so only the bad ones fail. Lookups are read again: a deleted task's reports are dropped.
        log.warning("a run of %d reports failed to store (%r); storing them one by one", len(collected), exc)
        lookups.forget()
        _store_one_by_one(reports, collected, stored, appended)
    else:
        _stored(batch, stored)
    for index in artifacts:  # each on its own (one can be large), after the points and samples of its run
        try:
            stored.artifacts += handle_task_artifact(reports[index][1], appended[index]) is not None
        except Exception as exc:
            _failed(stored, index, TASK_ARTIFACT, exc)
    if marks is not None:
        marks.save()
    return stored


def _store_one_by_one(
    reports: list[tuple[str, Any]], indexes: list[int], stored: Stored, appended: list[Appended | None]
) -> None:
    """Each report (each one of a bundle) in a transaction of its own: what the database refuses fails alone, and the
    entry it came in is dead-lettered (once), its other reports stored."""
    for index in indexes:
        name, payload = reports[index]
        try:
            parts = _open(name, payload, appended[index]) or []
        except Exception as exc:
            _failed(stored, index, name, exc)
            continue
        for part in parts:
            single = Batch.empty()
            try:
                if not _COLLECTORS[part[0]](part, single):
                    stored.dropped += 1
                    continue
                with transaction.atomic():
                    _write(single)
            except Exception as exc:
                _failed(stored, index, part[0], exc)
                continue
            _stored(single, stored)


def _task_id(body: Any) -> int | None:
    task_id = body.get("task_id") if isinstance(body, dict) else None
    return task_id if type(task_id) is int else None


def _open(name: str, payload: Any, appended: Appended | None) -> list[Part] | None:
    """The verified reports an entry carries (one MAC checked, a bundle's too); None when it is refused (logged and
    counted). A bundle's part that is not a report it may carry is dropped, logged and counted."""
    if name not in _COLLECTORS and name != HOST_REPORTS:
        log.warning("dropped a report of unknown kind %r", str(name)[:100])
        counters.incr(auth.MALFORMED)
        return None
    accepted = opened(payload, name, appended)
    if accepted is None:
        return None
    host, sent_at = accepted.host, accepted.message.ts
    if name != HOST_REPORTS:
        return [(name, host, sent_at, accepted.message.body)]
    bundle = body_as(host, name, accepted.message.body, HostReports)
    if bundle is None or not isinstance(bundle.reports, list):
        return None
    parts: list[Part] = []
    for item in bundle.reports:
        if not (isinstance(item, list) and len(item) == 2 and item[0] in BUNDLED):
            log.warning("host %s: dropped a bundled report that is not one (%r)", host.name, str(item)[:100])
            counters.incr(auth.MALFORMED)
            continue
        parts.append((item[0], host, sent_at, item[1]))
    return parts


def _failed(stored: Stored, index: int, name: str, exc: Exception) -> None:
    """Note a report that raised, unless the infrastructure did: that propagates, and the run is tried again."""
    if transient(exc):
        raise exc
    # The traceback: what raises here is most likely a bug to fix, not just a bad report.
    log.warning("could not store a %s report: %r", str(name)[:100], exc, exc_info=exc)
    if all(index != seen for seen, _exc in stored.failed):  # an entry is dead-lettered once, however many parts failed
        stored.failed.append((index, exc))


# Called with the ids of tasks whose lines were just stored and whose exit waits for its last lines: the control
# plane applies those now due (orchestrator/agents/events.py registers it when the app is ready; the metrics package
# sits below the control loop and cannot call it by name).
LINES_IN: list[Callable[[list[int]], None]] = []


def _stored(batch: Batch, stored: Stored) -> None:
    """A committed batch: counted, then pushed to the pages watching its jobs."""
    stored.points += sum(len(points) for points in batch.stored_points.values())
    stored.samples += sum(len(rows) for _host, rows in batch.samples.values())
    stored.lines += batch.stored_lines
    if batch.lines:
        try:
            waiting = list(
                Task.objects.filter(pk__in={line.task_id for line in batch.lines}, exit_waiting__isnull=False)
                .order_by("pk")
                .values_list("pk", flat=True)
            )
            for hook in LINES_IN if waiting else ():
                hook(waiting)
        except Exception:  # the lines are committed; the agent's next heartbeat repeats the exit, applied then
            log.exception("could not apply the exits waiting for these lines")
    try:
        _publish(batch)
    except Exception:  # the rows are committed: failing now would store them again; pages catch up from history
        log.exception("could not publish what was stored")


def _collect_metrics(part: Part, batch: Batch) -> bool:
    name, host, sent_at, raw = part
    found = task_in(host, name, raw, TaskMetricsBatch, sent_at)
    if found is None:
        return False
    task, body, sent_at = found
    rows, facts = metric_rows(task, body.events if isinstance(body.events, list) else [])
    batch.points.extend(rows)
    if type(body.shed) is int and 0 < body.shed < 2**62:
        batch.shed[task.pk] = body.shed
    drops.merge(batch.dropped, task.pk, drops.reported(body.dropped))
    if facts is not None:
        batch.facts[task.pk] = (task, facts, sent_at)
    return True


def _collect_samples(part: Part, batch: Batch) -> bool:
    name, host, _sent_at, raw = part
    body = body_as(host, name, raw, HostSampleBatch)
    if body is None:
        return False
    rows = batch.samples.setdefault(host.pk, (host, []))[1]
    refused: list[str] = []
    for raw in body.samples[:MAX_EVENTS_PER_BATCH] if isinstance(body.samples, list) else []:
        try:
            sample = parse_sample(raw)  # checked like a report: a GPU entry with "index": "x" never reaches a page
        except ValueError as exc:
            refused.append(str(exc))
            continue
        rows.append(
            HostSample(
                host=host,
                ts=sample["ts"],
                cpu_percent=sample["cpu_percent"],
                memory_used_mb=sample["memory_used_mb"],
                memory_total_mb=sample["memory_total_mb"],
                gpus=sample["gpus"],
            )
        )
    if refused:
        log.warning("host %s: %d sample(s) refused, e.g. %s", host.name, len(refused), refused[0][:200])
        counters.incr(SAMPLES_REFUSED, len(refused))
    return True


def _collect_logs(part: Part, batch: Batch) -> bool:
    name, host, sent_at, raw = part
    found = task_in(host, name, raw, TaskLogBatch, sent_at)
    if found is None:
        return False
    task, body, _sent_at = found
    try:
        lines = [(int(seq), str(stream)[:6], str(text)[:MAX_LOG_LINE_CHARS]) for seq, stream, text in body.lines]
    except (TypeError, ValueError) as exc:
        log.warning("malformed log batch for task %s: %r", task.pk, exc)
        counters.incr(DROPPED)
        return False
    batch.lines.extend(
        TaskLogLine(task_id=task.pk, seq=seq, stream=stream, text=text) for seq, stream, text in lines[:MAX_LOG_LINES]
    )
    batch.log_jobs.add(task.job_id)
    drops.merge(batch.dropped, task.pk, drops.reported({"log_lines": body.dropped}))
    return True


_COLLECTORS = {TASK_METRICS: _collect_metrics, HOST_SAMPLES: _collect_samples, TASK_LOGS: _collect_logs}


def _write(batch: Batch) -> None:
    # Every job and task row the batch writes to, locked first and in the one order (orchestrator/models/row_locks.py):
    # a task's facts were written before its job's, and a cancel holding the job deadlocked with it.
    written = batch.facts.keys() | batch.shed.keys() | batch.dropped.keys() | {line.task_id for line in batch.lines}
    lock_rows(jobs={row[0] for row in batch.points}, tasks=written)
    if batch.points:
        # Past a job's point limit its series are thinned (limits.keep_point); counted on the job for its page.
        rows, left_out = within_limits(batch.points)
        inserted: dict[int, int] = {}
        if rows:
            batch.stored_points, inserted = upsert_points(rows)
        count_points(inserted, left_out)
    if batch.shed:
        count_shed(batch.shed)
    drops.store(batch.dropped)
    for task, facts, sent_at in list(batch.facts.values()):
        # Not over the facts of a newer report (a late or replayed entry): refused, counted, not pushed to pages.
        newer = Q(facts_at__isnull=True) | Q(facts_at__lte=sent_at)
        if not Task.objects.filter(newer, pk=task.pk).update(facts=facts, facts_at=sent_at):
            log.info("task %s: facts of a report sealed at %.3f not stored: a newer report's are", task.pk, sent_at)
            counters.incr(FACTS_OUTDATED)
            del batch.facts[task.pk]
            continue
        if (task.type, task.index) == speaks_for_job(task.job.strategy):  # the task whose exit decides the job
            Job.objects.filter(pk=task.job_id).update(facts=facts)
            # A preempted job placed again: its resume line names the checkpoint this process restored.
            if isinstance(facts, dict):
                JobEvent.resumed_from(task.job_id, facts.get("resumed_from_epoch"), facts.get("resumed_from_step"))
    # Job.progress of the jobs whose speaking task sent train or epoch_end points or facts: one UPDATE for them all.
    phases: dict[str, set[int]] = {"train": set(), "epoch_end": set()}
    for points in batch.stored_points.values():
        for point in points:
            phases.get(point[2], set()).add(point[1])
    progress.update(phases["train"], due=phases["epoch_end"] | batch.facts.keys())
    rows = [row for _host, host_rows in batch.samples.values() for row in host_rows]
    if rows:
        HostSample.objects.bulk_create(rows, ignore_conflicts=True)
    if batch.lines:
        # A re-read entry carries the same (task, seq): stored once; each task's log is cut at its limit.
        batch.stored_lines = log_store.store_lines(batch.lines)


def _publish(batch: Batch) -> None:
    """One metrics frame per job, in id order (pages drop ids at or below their cursor), then facts and host load."""
    live.publish_each(
        [
            (job_id, {"type": "metrics", "points": points, "cursor": points[-1][0]})
            for job_id, points in batch.stored_points.items()
        ]
    )
    for task, facts, _sent_at in batch.facts.values():
        live.publish(task.job_id, {"type": "facts", "task": task.pk, "facts": facts})
    for job_id in batch.log_jobs:
        live.logs_stored(job_id)
    if not any(rows for _host, rows in batch.samples.values()):
        return
    try:  # host -> jobs with a live process there, or one that just ended (metrics/hosts.py)
        watching = hosts.jobs_watching(list(batch.samples))
    except DatabaseError as exc:  # the samples are stored; a page shows them on its next load
        log.warning("could not find the jobs watching hosts %s: %s", list(batch.samples), exc)
        return
    for host_id, (host, rows) in batch.samples.items():
        if not rows or not watching[host_id]:
            continue
        frame = {"type": "hosts", "samples": [hosts.sample_dict(host.name, r) for r in rows]}
        # Every job with a process on this host shows the host's load.
        for job_id in watching[host_id]:
            live.publish(job_id, frame)


def handle_task_metrics(payload: Any) -> int:
    """One TASK_METRICS report on its own (tests, tools); the stream consumer stores many at once."""
    return store_reports([(TASK_METRICS, payload)]).points


def handle_task_logs(payload: Any) -> int:
    """One TASK_LOGS report on its own (tests, tools, and any sent through the orchestrator queue by an older agent)."""
    return store_reports([(TASK_LOGS, payload)]).lines
