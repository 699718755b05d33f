"""The scheduler queue, consumed only by the worker that holds the `scheduler` lease.

A consumer step of the control plane's workers (config/celery.py adds it): in a worker that consumes the `scheduler`
queue, it competes for the lease from the worker's start and, on the consumer's own timer (its event loop, where Kombu
may be touched), starts consuming the queue when this worker acts and stops when it does not. A standby worker so
takes no pass message at all (had it taken one, the pass would find the cluster held or race the holder for it).
A message this worker had already taken when it lost the lease reaches `may_schedule()`, which the pass asks first:
not acting, the message goes back to the queue for the holder (orchestrator/tasks.py).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from contracts.protocol import SCHEDULER_QUEUE

log = logging.getLogger(__name__)

CHECK_EVERY_S = 0.5  # how soon the consumer follows its keeper (the keeper itself tries every TFDASH_LEASE_RETRY_S)


def may_schedule() -> bool:
    """Whether a pass may run in this process: it holds the scheduler lease, or it does not compete for it (a
    process that calls the scheduler directly: tests, management commands)."""
    from orchestrator.leases import keeper, store  # noqa: PLC0415 - the step loads before Django

    running = keeper.running(store.SCHEDULER)
    return running is None or running.acting()


class SchedulerLeaseGate(bootsteps.StartStopStep):
    """Consume the scheduler queue only while holding the scheduler lease."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.keeper: Any = None
        self.entry: Any = None
        self.consuming = True

    def start(self, consumer: Any) -> None:
        if SCHEDULER_QUEUE not in consumer.app.amqp.queues.consume_from:
            return
        from orchestrator.leases import keeper, store  # noqa: PLC0415 - Django is set up once the worker starts

        self.keeper = keeper.keep(store.SCHEDULER, role=str(consumer.hostname))
        # The consumer (re)starts consuming every queue it was given: follow the lease before its loop begins.
        self.consuming = True
        self._follow(consumer)
        self.entry = consumer.timer.call_repeatedly(CHECK_EVERY_S, self._follow, (consumer,))

    def _follow(self, consumer: Any) -> None:
        acting = self.keeper.acting()
        if acting and not self.consuming:
            consumer.add_task_queue(SCHEDULER_QUEUE)
            log.warning("consuming the %s queue: this worker holds the scheduler lease", SCHEDULER_QUEUE)
        elif not acting and self.consuming:
            # Kombu's consumer only (not cancel_task_queue): the worker still counts the queue as its own.
            consumer.task_consumer.cancel_by_queue(SCHEDULER_QUEUE)
            log.warning("not consuming the %s queue: another worker holds the scheduler lease", SCHEDULER_QUEUE)
        self.consuming = acting

    def stop(self, consumer: Any) -> None:
        if self.entry is not None:
            self.entry.cancel()
            self.entry = None

    def shutdown(self, consumer: Any) -> None:
        self.stop(consumer)
        if self.keeper is not None:
            from orchestrator.leases import keeper, store  # noqa: PLC0415

            keeper.stop(store.SCHEDULER)  # handed back: the standby takes over at its next try
            self.keeper = None
