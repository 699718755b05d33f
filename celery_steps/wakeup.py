"""Keep a thread-pool worker's consumer loop ticking, so that it takes the next messages as soon as it may.

Celery's consumer takes messages from Redis in its event loop (one thread, sleeping in `epoll`), at most the prefetch
count unacknowledged at a time. With `--pool threads` a handler and its acknowledgement run in a pool thread, and
nothing wakes the loop when one ends: once the prefetch count is reached the loop no longer waits on Redis, so it
sleeps until its next timer, up to 10 s later (Celery's `Timer(max_interval=10)`; Kombu's own Redis timer is 10 s
too), then takes one prefetch count's worth and sleeps again (celery/celery#6941, open). Measured on the orchestrator
(bench/scale.py, 50 simulated hosts): its queue grew to 580 messages while all four pool threads were idle, about 20
taken every 10 s; watchdog ticks expired unread for two minutes and no scheduler pass ran.

A timer that fires every WAKE_EVERY_S bounds that sleep (the workaround given in the issue); each tick costs one
empty loop turn. The loop's poll timeout is the time to its next timer, so nothing else changes.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, bootsteps

WAKE_EVERY_S = 0.02


def _tick() -> None:
    """Nothing: a timer that fires is what makes the loop turn and ask Redis for more."""


class KeepAwake(bootsteps.StartStopStep):
    """A consumer step (it runs in every kind of worker, test workers included): the tick, for the consumer's life."""

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.entry: Any = None

    def start(self, consumer: Any) -> None:
        self.entry = consumer.timer.call_repeatedly(WAKE_EVERY_S, _tick)

    def stop(self, consumer: Any) -> None:
        if self.entry is not None:
            self.entry.cancel()
            self.entry = None


def keep_consumer_awake(app: Celery) -> None:
    """Every worker of `app` gets the tick (not other apps in the same process: tests, tools)."""
    app.steps["consumer"].add(KeepAwake)
