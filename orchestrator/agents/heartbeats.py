"""Heartbeats in batches: the reader of every host's heartbeat stream (contracts/broker.py HEARTBEATS).

500 hosts beating every 3 s are ~170 reports a second; as Celery messages, one handler run each, they cost about two
thirds of a core (bench/scale.py). Read a few hundred at a time, a batch costs:
- one query for the hosts and one Redis round trip for the nonces (orchestrator/identity/auth.py authenticate_batch);
- one UPDATE of `last_heartbeat` for every host whose report only says "still here, same facts" (the steady case),
  and the full per-host path (orchestrator/agents/reports.py) for the few whose facts or status change;
- one query for the tasks of every reporting host, compared in memory with each report
  (orchestrator/agents/reconcile.py); only a host whose report disagrees costs statements of its own;
- one round trip for the report lags, one to remember the nonces, one to acknowledge and delete the entries.

Every orchestrator worker runs one reader (orchestrator/plumbing/streams.py, a thread started with the worker:
`start_reader`), each a consumer of its own name in the group, so adding orchestrator workers adds readers. An entry is
acknowledged after its batch was applied; one read but never acknowledged (the worker died) is read again by its
consumer when it comes back, or claimed by another reader once it has sat idle for a while. Either way it is by then
stale and dropped: a heartbeat is worth something only while it is fresh, and the next one from the same host follows
within seconds.

The watchdog judges no host while a heartbeat has waited unapplied for long (`unapplied_age_s`: no reader reads, or
one is stuck holding a batch): the silence could then be this side's, not the host's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import redis
from django.db import DatabaseError
from django.db.models import F, FloatField, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from contracts import broker
from contracts.host_reports import HostFacts
from contracts.protocol import AGENT_HEARTBEAT, HEARTBEAT_GROUP
from orchestrator.agents import reconcile, reports
from orchestrator.environments import orders as environment_orders
from orchestrator.identity import auth
from orchestrator.models import Host, HostStatus
from orchestrator.plumbing import counters, streams

log = logging.getLogger(__name__)

READ_COUNT = 1000  # over every host's stream
PER_STREAM = 20  # a host beats every few seconds: more than one beat waiting in its stream is a backlog
CLAIM_IDLE_MS = 20_000  # entries another reader took and left this long are taken over (and dropped as stale)
CLAIM_EVERY_S = 5.0
GATHER_S = 0.5  # between reads, while they are not full: beats gather into batches (and wait at most this long)


def apply_batch(payloads: list[Any]) -> int:
    """Apply a batch of sealed heartbeats; returns how many were accepted."""
    accepted = auth.authenticate_batch(payloads, AGENT_HEARTBEAT)
    if not accepted:
        return 0
    # The newest report per host: each says the agent's whole truth, an older one in the same batch adds nothing.
    newest: dict[int, auth.Accepted] = {}
    for one in accepted:
        seen = newest.get(one.host.pk)
        if seen is None or one.message.ts > seen.message.ts:
            newest[one.host.pk] = one
    lags: dict[str, float] = {}
    checked = []
    for one in newest.values():
        facts = reports.check(one.host, one.message.ts, one.message.body, lags)
        if facts is not None:
            checked.append((one.host, facts, one.message.body, one.message.ts))
    counters.record_readings(reports.REPORT_LAG, lags)

    steady: list[Host] = []
    changed: list[tuple[Host, HostFacts, float]] = []
    for host, facts, _body, sent_at in checked:
        if host.says_the_same(facts):
            steady.append(host)
        else:
            changed.append((host, facts, sent_at))
    if steady:
        ids = [host.pk for host in steady]
        # The stored facts are confirmed as of these reports: their sealed time moves on too (to the batch's oldest,
        # which none of them is older than), so a late report of older facts cannot undo them.
        confirmed_at = Value(min(sent_at for _h, _f, _b, sent_at in checked), output_field=FloatField())
        updated = Host.objects.filter(pk__in=ids, status=HostStatus.ONLINE).update(
            last_heartbeat=timezone.now(), facts_at=Greatest(F("facts_at"), confirmed_at)
        )
        if updated != len(ids):
            # Flipped offline by the watchdog since they were read: the full path brings them back, saying so.
            back = set(Host.objects.filter(pk__in=ids).exclude(status=HostStatus.ONLINE).values_list("pk", flat=True))
            by_pk = {host.pk: (host, facts, sent_at) for host, facts, _body, sent_at in checked}
            for pk in back:
                host, facts, sent_at = by_pk[pk]
                host.status = HostStatus.OFFLINE
                changed.append((host, facts, sent_at))
    for host, facts, sent_at in changed:
        reports.record(host, facts, hello=False, sent_at=sent_at)

    # A host whose environments are not its cluster's (an order lost or stale) is told them again.
    try:
        environment_orders.converge([(host, facts) for host, facts, _b, _t in checked])
    except DatabaseError:
        raise  # the whole batch is read again
    except Exception:  # telling is best effort: the batch's beats are applied all the same
        log.exception("could not tell hosts their task environments")
    task_reports = [(host, report) for host, _f, body, _t in checked if (report := reports.task_report(host, body))]
    rows = reconcile.rows_of(task_reports)
    for host, report in task_reports:
        try:
            reconcile.converge(host, report, rows[host.pk])
        except DatabaseError:
            raise  # the whole batch is read again
        except Exception:  # one host's report must not keep the others' from being applied
            log.exception("could not converge host %s on its heartbeat", host.name)
    auth.remember_all(accepted)
    return len(accepted)


def apply_entries(entries: list[streams.Entry]) -> list[tuple[streams.Entry, Exception]]:
    """The stream reader's handler: each entry's sealed heartbeat, applied in one batch; what is not a heartbeat of
    the stream's own host is refused (dead-lettered and counted)."""
    payloads, refused = [], []
    for entry in entries:
        try:
            name, payload = streams.read_entry(entry)
            if name != AGENT_HEARTBEAT:
                raise ValueError(f"{name[:100]!r} on a heartbeat stream")
        except Exception as exc:
            counters.incr(auth.MALFORMED)
            refused.append((entry, exc))
            continue
        payloads.append(payload)
    apply_batch(payloads)
    return refused


def reader(
    client: redis.Redis, consumer: str, hosts: Callable[[], Iterable[str]] | None = None
) -> streams.StreamReader:
    """A reader of every host's heartbeat stream, named `consumer` in the group (see the module's doc)."""
    return streams.StreamReader(
        client,
        kind=broker.HEARTBEATS,
        group=HEARTBEAT_GROUP,
        consumer=consumer,
        handler=apply_entries,
        hosts=hosts or streams.all_host_names,
        read_count=READ_COUNT,
        per_stream=PER_STREAM,
        idle_s=GATHER_S,
        claim_idle_ms=CLAIM_IDLE_MS,
        claim_every_s=CLAIM_EVERY_S,
    )


def unapplied_age_s(client: redis.Redis) -> float:
    """How long the oldest heartbeat not applied yet has been waiting (read by a reader and not acknowledged, or not
    read at all), over every host's stream; 0.0 when none waits. Measured on Redis's clock, which stamped the entries.
    The watchdog judges no host while this is large: some host's report may be among those waiting
    (orchestrator/agents/liveness.py)."""
    return streams.oldest_waiting_age_s(client, broker.HEARTBEATS, HEARTBEAT_GROUP, streams.all_host_names())


def start_reader(client: redis.Redis, consumer: str) -> threading.Event:
    """Run a reader named `consumer` in a daemon thread of this process (once per name); set the returned event to
    stop it."""
    return streams.start(reader(client, consumer))
