"""Celery entry points on the `orchestrator` queue, the one place they are defined. Thin: each hands its payload to
the module that owns the logic; domain code asks for a scheduler pass by name (orchestrator/plumbing/pass_requests.py).

At least once, applied once: messages are acknowledged after the handler returns (settings: acks_late,
reject_on_worker_lost); a handler that meets a database or broker outage is retried with backoff; every handler is
idempotent. A restarted orchestrator first takes back what a dead one had taken and not acknowledged (`_redeliver`).

What hosts send never travels here: every orchestrator worker reads the hosts' streams and applies what it reads
(hello and task events: orchestrator/agents/intake.py; heartbeats: orchestrator/agents/heartbeats.py; the metric
traffic: the ingest, orchestrator/metrics/stream.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis
from celery.exceptions import Reject
from celery.signals import worker_ready, worker_shutting_down
from django.conf import settings
from django.db import close_old_connections

from contracts.protocol import ORCHESTRATOR_QUEUE, SCHEDULER_QUEUE
from kombu_redis import redeliver, transport
from orchestrator.agents import heartbeats, intake, liveness
from orchestrator.experiments import actions as experiments
from orchestrator.identity import broker_users
from orchestrator.jobs import dispatch, hangs, reaping, time_limits
from orchestrator.leases.queue_gate import may_schedule
from orchestrator.metrics import rollups as point_rollups
from orchestrator.metrics.retention import thin_host_samples
from orchestrator.models import Job
from orchestrator.plumbing import counters, start_up
from orchestrator.plumbing import pass_requests as passes
from orchestrator.plumbing.celery_app import app
from orchestrator.plumbing.outages import TRANSIENT
from orchestrator.scheduler import scheduling
from orchestrator.scheduler.queueing import WAITING_STATES
from orchestrator.webhooks import outbox as webhook_outbox

log = logging.getLogger(__name__)

# Malformed messages this app's consumers dropped (kombu_redis/transport.py), in all orchestrator processes together.
BROKER_MESSAGES_DROPPED = "broker_messages_dropped"
transport.on_drop(lambda: counters.incr(BROKER_MESSAGES_DROPPED))


def entry(name: str) -> Callable[[Callable[..., None]], Any]:
    """A Celery entry point on the orchestrator queue, retried with backoff (jittered, 1 s doubling up to 30 s apart,
    about 10 minutes in all) while the database or the broker is unavailable."""

    def register(handler: Callable[..., None]) -> Any:
        def run(*args: Any) -> None:
            try:
                handler(*args)
            except TRANSIENT as exc:
                log.warning("%s met %r; it will be retried", name, exc)
                close_old_connections()  # the next try opens a fresh connection
                raise

        run.__name__ = run.__qualname__ = handler.__name__
        run.__doc__ = handler.__doc__
        return app.task(
            name=name,
            ignore_result=True,
            autoretry_for=TRANSIENT,
            retry_backoff=1,
            retry_backoff_max=30,
            max_retries=25,
        )(run)

    return register


@entry(dispatch.LAUNCH)
def launch(task_ids: Any) -> None:
    """The launch orders of tasks a scheduler pass placed (orchestrator/jobs/dispatch.py)."""
    if not isinstance(task_ids, list) or not all(type(i) is int for i in task_ids):
        log.warning("ignored a launch message that is not a list of task ids")
        return
    dispatch.launch_tasks(task_ids[: dispatch.LAUNCH_CHUNK])


@entry(passes.SCHEDULE)
def schedule(cluster_id: int) -> None:
    if not may_schedule():  # taken before this worker lost the scheduler lease: the holder's to run
        raise Reject("this worker does not hold the scheduler lease", requeue=True)
    # A pass follows every job's end: the next run of a one-after-another experiment is submitted first.
    experiments.advance_all(cluster_id)
    scheduling.schedule_cluster(cluster_id, wait=False)


@entry("orchestrator.watchdog")
def watchdog() -> None:
    """Every tick: the hosts' broker users converge (every few seconds), silent hosts go offline, jobs past their
    start-up deadline fail, queued jobs get another look (capacity may have come back without any event this process
    saw): a pass is asked for, which joins any already due (orchestrator/plumbing/pass_requests.py)."""
    broker_users.sync_now_and_then()
    liveness.mark_silent_hosts_offline()
    time_limits.check_startup_deadlines()
    time_limits.check_time_limits()
    reaping.reap_finished_jobs()
    hangs.check_progress()
    experiments.advance_all()  # level-triggered: no experiment waits on a message that was lost
    for cluster_id in set(Job.objects.filter(state__in=WAITING_STATES).values_list("cluster_id", flat=True)):
        passes.schedule_soon(cluster_id)


@entry("orchestrator.webhooks")
def webhooks() -> None:
    """Every TFDASH_WEBHOOK_SWEEP_S, on the `webhooks` queue (beat routes it there: config/settings.py), so only the
    webhooks worker runs it: job state changes fanned out to webhooks, due deliveries POSTed (bounded)."""
    webhook_outbox.sweep()


@entry("orchestrator.rollups")
def rollups() -> None:
    """Every TFDASH_ROLLUP_INTERVAL_S: long jobs' new points added to their rollups (bounded per run)."""
    point_rollups.roll_up_due()


@entry("orchestrator.retention")
def retention() -> None:
    """Every few minutes (settings.CELERY_BEAT_SCHEDULE): old host samples thinned, a bounded amount per run."""
    thin_host_samples()


def consumed_queues() -> set[str]:
    """The queues this worker consumes (its -Q), not every queue the app knows (its default queue is always there)."""
    return set(app.amqp.queues.consume_from)


@worker_ready.connect
def _read_hosts_streams(sender: Any = None, **_: Any) -> None:
    """Every orchestrator worker reads the hosts' heartbeat and events streams too, and applies what it reads there (a
    heartbeat reader thread, orchestrator/agents/heartbeats.py; intake.READERS event reader threads,
    orchestrator/agents/intake.py), as consumers named after the worker, and sets up the hosts' broker users (a Redis
    that restarted without them lets no agent in until then).

    The readers start first, whatever else fails: each waits out a database or Redis outage by itself, while a worker
    started during one and left without readers would stay up applying nothing, every host's heartbeats and exits
    waiting (the chaos soak found one started while PostgreSQL was down). The users' sync is retried in the
    background until both answer (orchestrator/plumbing/start_up.py)."""
    if ORCHESTRATOR_QUEUE not in consumed_queues():
        return
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10, socket_connect_timeout=5)
    name = str(getattr(sender, "hostname", None) or app.conf.get("worker_name") or "orchestrator")
    for stop in (heartbeats.start_reader(client, name), *intake.start_readers(client, name)):
        worker_shutting_down.connect(lambda stop=stop, **_: stop.set(), weak=False)
    start_up.retried("sync the hosts' broker users", broker_users.sync)


@worker_ready.connect
def _redeliver(sender: Any = None, **_: Any) -> None:
    """Put back on their queue the messages of this worker's queues (orchestrator, scheduler) taken and never
    acknowledged by a worker that died (SIGKILL, power loss): without this they would wait out the visibility
    timeout. A message some other live worker is handling right now comes back too, and is applied once all the same
    (every handler is idempotent). Retried in the background while Redis is away."""
    mine = {ORCHESTRATOR_QUEUE, SCHEDULER_QUEUE} & consumed_queues()

    def take_back() -> None:
        with app.connection_for_write() as conn:
            restored = redeliver.restore_unacked(conn, mine)
        if restored:
            log.warning("took back %d message(s) of %s a previous worker had not acknowledged", restored,
                        ", ".join(sorted(mine)))  # fmt: skip

    start_up.retried("take back unacknowledged messages", take_back)
