"""Celery beat under the `beat` lease (orchestrator/leases/beat.py): a beat whose process does not hold the lease
sends nothing; once the holder hands it back, it takes the lease and sends."""

from __future__ import annotations

import time

import pytest
import redis
from celery import Celery
from django.conf import settings

from orchestrator.leases import store
from orchestrator.leases.beat import STANDBY_TICK_S, LeasedScheduler
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "lease-test-beat"


def test_a_standby_beat_sends_nothing_until_it_holds_the_lease(tmp_path) -> None:
    app = Celery("lease-test", broker=settings.REDIS_URL)
    app.conf.beat_schedule = {"tick": {"task": "lease.test.tick", "schedule": 0.1, "options": {"queue": QUEUE}}}
    queue = redis.Redis.from_url(settings.REDIS_URL)
    queue.delete(QUEUE)
    assert store.take_or_renew(store.BEAT, "the other control plane's beat", 30)
    beat = LeasedScheduler(app=app, schedule_filename=str(tmp_path / "schedule"))
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert beat.tick() <= STANDBY_TICK_S
            time.sleep(0.1)
        assert queue.llen(QUEUE) == 0 and not beat.lease.acting()

        assert store.release(store.BEAT, "the other control plane's beat")
        wait_until(beat.lease.acting, 30, what="the standby beat to take the lease")

        def sent() -> int:
            beat.tick()
            return queue.llen(QUEUE)

        wait_until(sent, 30, what="the beat to send once it holds the lease")
    finally:
        beat.close()
        queue.delete(QUEUE)
    assert not any(h.live for h in store.read_all() if h.name == store.BEAT)  # handed back on close
